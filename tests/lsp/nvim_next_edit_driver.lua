-- Next edits in Neovim (editors/nvim/codespec.lua) against an in-process fake language server
-- whose copilotInlineEdit replies the scenario writes (tests/lsp/test_nvim_client.py): the preview,
-- <Tab> accepting it, :CodespecNextEditReject, a reply for a version the buffer has left and a
-- request the user typed over.
--   CODESPEC_NVIM_TEST='{"repo", "out", "file"}' nvim --headless --clean -S nvim_next_edit_driver.lua
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
      hl = details.hl_group, virt_lines = virt_lines }
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
    changedtick = vim.b[bufnr].changedtick }
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
  vim.wait(50)
  seen.typed_over.after_tab = H.line(bufnr, 6)
end)
