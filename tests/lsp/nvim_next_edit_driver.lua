-- Next edits in Neovim (editors/nvim/codespec.lua) against an in-process fake language server
-- whose copilotInlineEdit replies the scenario writes (tests/lsp/test_nvim_client.py): the preview,
-- <Tab> accepting it, :CodespecNextEditReject, a reply for a version the buffer has left, a
-- request the user typed over, and replies naming other files: an open buffer (<Tab> goes there,
-- <Tab> applies), a file not open (opened, asked there) and a stale one (never applied anywhere).
--   CODESPEC_NVIM_TEST='{"repo", "out", "file", "other", "third"}' nvim --headless --clean -S nvim_next_edit_driver.lua
local H = dofile(vim.json.decode(vim.env.CODESPEC_NVIM_TEST).repo .. '/tests/lsp/nvim_harness.lua')
local config = H.config

local edits = {}
local fake_cmd, server = H.fake_server({
  positionEncoding = 'utf-16',
  textDocumentSync = { openClose = true, change = 2 },
}, function(method, params, id, answer)
  if method ~= 'textDocument/copilotInlineEdit' then
    return false
  end
  edits[#edits + 1] = { id = id, params = params, answer = answer }
  return true
end)
server.edits = edits

local function next_request(after)
  return H.wait_for('next-edit request #' .. (after + 1), function() return server.edits[after + 1] end, 10000)
end

-- The next edit the fake suggests: "fetch" -> "fetch_all" on line 6 (0-based 5), utf-16 columns.
local function rename_edit(version)
  local line = vim.api.nvim_buf_get_lines(0, 5, 6, true)[1]
  local col = vim.str_utfindex(line:sub(1, line:find('fetch', 1, true) - 1), 'utf-16')
  return {
    text = 'fetch_all',
    range = { start = { line = 5, character = col }, ['end'] = { line = 5, character = col + 5 } },
    textDocument = { uri = vim.uri_from_bufnr(0), version = version },
    command = { title = 'accepted', command = 'codespec.accepted', arguments = { 'next', 1 } },
  }
end

local function marks(bufnr)
  local ns = vim.api.nvim_get_namespaces().codespec_next_edit
  local found = {}
  for _, mark in ipairs(vim.api.nvim_buf_get_extmarks(bufnr, ns, 0, -1, { details = true })) do
    local details = mark[4]
    local virt_lines = {}
    for _, line in ipairs(details.virt_lines or {}) do
      virt_lines[#virt_lines + 1] = { line[1][1], line[1][2] }
    end
    found[#found + 1] = { row = mark[2], col = mark[3], end_row = details.end_row, end_col = details.end_col,
      hl = details.hl_group, virt_lines = virt_lines, virt_text = details.virt_text and details.virt_text[1] }
  end
  return found
end

H.run(function(seen)
  local codespec = require('codespec')
  codespec.setup({ cmd = fake_cmd })
  vim.cmd.edit(config.file)
  local bufnr = vim.api.nvim_get_current_buf()
  H.attach(bufnr)

  -- 1. The user renames on line 2 ("fetch" -> "fetch_all"), then asks: the preview shows.
  H.keys('2G0ffea_all<Esc>')
  H.wait_for('the edit', function() return H.line(bufnr, 2):find('fetch_all', 1, true) end)
  H.wait_for('normal mode', function() return H.mode() == 'n' end)
  vim.cmd('CodespecNextEdit')
  local request = next_request(0)
  seen.asked = { version = request.params.textDocument.version, position = request.params.position,
    changedtick = vim.b[bufnr].changedtick, other_documents = request.params.otherDocuments }
  request.answer(nil, { edits = { rename_edit(request.params.textDocument.version) } })
  H.wait_for('the preview', function() return codespec.next_edit_status(bufnr).edit end)
  seen.preview = { marks = marks(bufnr), lines = vim.api.nvim_buf_get_lines(bufnr, 0, -1, true) }
  H.wait_for('didShowInlineEdit', function()
    return vim.tbl_contains(server.notifications, 'textDocument/didShowInlineEdit')
  end)

  -- 2. <Tab> in normal mode applies it and runs its command.
  H.keys('<Tab>')
  H.wait_for('the accepted edit', function() return H.line(bufnr, 6):find('fetch_all', 1, true) end)
  seen.accepted = { lines = vim.api.nvim_buf_get_lines(bufnr, 0, -1, true), marks = marks(bufnr) }
  H.wait_for('the command', function() return server.commands[1] end)
  seen.commands = vim.deepcopy(server.commands)

  -- 3. Dismissed: the preview goes, the buffer stays.
  H.keys('u')
  H.wait_for('the undo', function() return not H.line(bufnr, 6):find('fetch_all', 1, true) end)
  vim.cmd('CodespecNextEdit')
  request = next_request(1)
  request.answer(nil, { edits = { rename_edit(request.params.textDocument.version) } })
  H.wait_for('the second preview', function() return codespec.next_edit_status(bufnr).edit end)
  vim.cmd('CodespecNextEditReject')
  seen.rejected = { marks = marks(bufnr), line = H.line(bufnr, 6), status = codespec.next_edit_status(bufnr) }

  -- 4. A reply naming a version the buffer has left: not shown.
  vim.cmd('CodespecNextEdit')
  request = next_request(2)
  request.answer(nil, { edits = { rename_edit(request.params.textDocument.version - 1) } })
  H.wait_for('the stale reply', function() return codespec.next_edit_status(bufnr).none end)
  seen.stale_version = { marks = marks(bufnr), status = codespec.next_edit_status(bufnr) }

  -- 5. Typed over while pending: cancelled, and its late answer is never shown.
  vim.cmd('CodespecNextEdit')
  request = next_request(3)
  H.keys('1GA # typed<Esc>')
  H.wait_for('the cancellation', function() return vim.tbl_contains(server.cancels, request.id) end)
  request.answer(nil, { edits = { rename_edit(request.params.textDocument.version) } })
  H.wait_for('the late answer to be handled', function() return true end)
  vim.wait(50)
  seen.typed_over = { marks = marks(bufnr), status = codespec.next_edit_status(bufnr), line = H.line(bufnr, 6) }
  H.keys('<Tab>') -- nothing shown: <Tab> does what it always does, the buffer is unchanged
  H.settle()
  seen.typed_over.after_tab = H.line(bufnr, 6)

  -- 6. The next site is in another open buffer: a hint here, <Tab> goes there and shows the
  -- preview, <Tab> applies it there.
  vim.cmd.edit(config.other)
  local other = vim.api.nvim_get_current_buf()
  H.attach(other)
  vim.api.nvim_win_set_buf(0, bufnr)
  local other_uri = vim.uri_from_bufnr(other)
  local function other_edit(version, line)
    local text = vim.api.nvim_buf_get_lines(other, line, line + 1, true)[1]
    local col = text:find('fetch', 1, true) - 1
    return {
      text = 'fetch_all',
      range = { start = { line = line, character = col }, ['end'] = { line = line, character = col + 5 } },
      textDocument = { uri = other_uri, version = version },
      command = { title = 'accepted', command = 'codespec.accepted', arguments = { 'other', 1 } },
    }
  end
  local next_lines = vim.api.nvim_buf_get_lines(bufnr, 0, -1, true)
  vim.cmd('CodespecNextEdit')
  request = next_request(4)
  request.answer(nil, { edits = { other_edit(vim.lsp.util.buf_versions[other], 1) } })
  H.wait_for("the hint", function() return codespec.next_edit_status(bufnr).elsewhere end)
  seen.hint = { marks = marks(bufnr), lines_unchanged = vim.deep_equal(next_lines,
    vim.api.nvim_buf_get_lines(bufnr, 0, -1, true)), status = codespec.next_edit_status(bufnr) }
  H.keys('<Tab>')
  H.wait_for('the jump', function() return vim.api.nvim_get_current_buf() == other end)
  H.wait_for('the preview there', function() return codespec.next_edit_status(other).edit end)
  seen.jumped = { cursor = H.cursor(), marks = marks(other), hint_left = marks(bufnr),
    line = H.line(other, 2), next_unchanged = vim.deep_equal(next_lines, vim.api.nvim_buf_get_lines(bufnr, 0, -1, true)) }
  H.keys('<Tab>')
  H.wait_for('the edit applied there', function() return H.line(other, 2):find('fetch_all', 1, true) end)
  seen.applied_there = { line = H.line(other, 2), marks = marks(other), commands = #server.commands }

  -- 7. The next site is in a file not open: <Tab> opens it and asks there, where the cursor is at
  -- the edit's start; that answer previews and applies as any other.
  vim.api.nvim_win_set_buf(0, bufnr)
  vim.cmd('CodespecNextEdit')
  request = next_request(5)
  local third_uri = vim.uri_from_fname(config.third)
  request.answer(nil, { edits = { {
    text = 'fetch_all',
    range = { start = { line = 2, character = 8 }, ['end'] = { line = 2, character = 13 } },
    textDocument = { uri = third_uri, version = vim.NIL },
    command = { title = 'accepted', command = 'codespec.accepted', arguments = { 'third', 1 } },
  } } })
  H.wait_for('the second hint', function() return codespec.next_edit_status(bufnr).elsewhere end)
  H.keys('<Tab>')
  request = next_request(6)
  local third = vim.api.nvim_get_current_buf()
  seen.opened = { uri = request.params.textDocument.uri, position = request.params.position,
    version = request.params.textDocument.version, did_open = vim.tbl_contains(server.opened, third_uri),
    buffer_is_third = vim.api.nvim_buf_get_name(third) == config.third, cursor = H.cursor() }
  request.answer(nil, { edits = { {
    text = 'fetch_all',
    range = { start = { line = 2, character = 8 }, ['end'] = { line = 2, character = 13 } },
    textDocument = { uri = third_uri, version = request.params.textDocument.version },
  } } })
  H.wait_for('the preview in the opened file', function() return codespec.next_edit_status(third).edit end)
  H.keys('<Tab>')
  H.wait_for('the edit applied in the opened file', function() return H.line(third, 3):find('fetch_all', 1, true) end)
  seen.third_line = H.line(third, 3)

  -- 8. A reply naming the other buffer with a version it has left (here: the asking buffer's
  -- version, which an earlier client compared alone): <Tab> applies nothing, anywhere.
  vim.api.nvim_win_set_buf(0, bufnr)
  local before_next = vim.api.nvim_buf_get_lines(bufnr, 0, -1, true)
  local before_other = vim.api.nvim_buf_get_lines(other, 0, -1, true)
  vim.cmd('CodespecNextEdit')
  request = next_request(7)
  local stale = other_edit(request.params.textDocument.version, 4)
  seen.stale_other = { versions_differ = stale.textDocument.version ~= vim.lsp.util.buf_versions[other] }
  request.answer(nil, { edits = { stale } })
  H.wait_for('the stale hint', function() return codespec.next_edit_status(bufnr).elsewhere end)
  H.keys('<Tab>')
  H.settle()
  seen.stale_other.buffer_is_next = vim.api.nvim_get_current_buf() == bufnr
  seen.stale_other.next_unchanged = vim.deep_equal(before_next, vim.api.nvim_buf_get_lines(bufnr, 0, -1, true))
  seen.stale_other.other_unchanged = vim.deep_equal(before_other, vim.api.nvim_buf_get_lines(other, 0, -1, true))
  seen.stale_other.status = codespec.next_edit_status(bufnr)
  seen.stale_other.other_status = codespec.next_edit_status(other)
end)
