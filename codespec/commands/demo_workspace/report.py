"""Print a table of shapes, using shapes.py."""

from shapes import Circle, Rectangle, Square, total_area


def describe(shape) -> str:
    name = type(shape).__name__
    return f"{name:<10} area={shape.area():8.2f} perimeter={shape.perimeter():8.2f}"


def main() -> None:
    shapes = [Circle(1.0), Rectangle(2.0, 3.0), Square(1.5)]
    for shape in shapes:
        print(describe(shape))
    print(f"total area: {total_area(shapes):.2f}")


if __name__ == "__main__":
    main()
