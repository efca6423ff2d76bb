"""Plane shapes with area and perimeter: a small workspace for the codespec demo."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Circle:
    radius: float

    def area(self) -> float:
        return math.pi * self.radius * self.radius

    def perimeter(self) -> float:
        return 2 * math.pi * self.radius

    def scaled(self, factor: float) -> "Circle":
        return Circle(self.radius * factor)


@dataclass(frozen=True)
class Rectangle:
    width: float
    height: float

    def area(self) -> float:
        return self.width * self.height

    def perimeter(self) -> float:
        return 2 * (self.width + self.height)

    def scaled(self, factor: float) -> "Rectangle":
        return Rectangle(self.width * factor, self.height * factor)


@dataclass(frozen=True)
class Square:
    side: float

    def area(self) -> float:
        return self.side * self.side

    


def total_area(shapes: list) -> float:
    return sum(shape.area() for shape in shapes)
