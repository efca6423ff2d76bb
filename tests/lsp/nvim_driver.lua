-- Drives Neovim's own LSP client, set up by editors/nvim/codespec.lua, against a real
-- `codespec serve` (tests/lsp/test_nvim_client.py). Every wait ends on an event; the timeouts
-- only guard against hangs. Writes what it saw as JSON to the output path.
--   nvim --headless --clean -l nvim_driver.lua REPO FILE OUT PYTHON
local repo, file, out_path, python, model = arg[1], arg[2], arg[3], arg[4], arg[5]
package.path = repo .. '/editors/nvim/?.lua;' .. package.path
local seen = { nvim = tostring(vim.version()), has_inline_completion = vim.lsp.inline_completion ~= nil }
local WAIT_MS = 120000

local function request(client, method, params, bufnr)
  local reply
  client:request(method, params, function(err, result)
    reply = { err = err, result = result }
  end, bufnr)
  assert(vim.wait(WAIT_MS, function() return reply ~= nil end, 10), method .. ': no reply')
  assert(not reply.err, method .. ': ' .. vim.inspect(reply.err))
  return reply.result
end

local ok, failure = pcall(function()
  require('codespec').setup({
    cmd = { python, '-m', 'codespec.commands.cli', 'serve' },
    init_options = { mode = 'auto', model = model, limits = { lineTokens = 16, editTokens = 200 } },
  })
  vim.cmd.edit(file)
  local bufnr = vim.api.nvim_get_current_buf()
  seen.filetype = vim.bo[bufnr].filetype
  local client
  assert(vim.wait(WAIT_MS, function()
    client = vim.lsp.get_clients({ bufnr = bufnr, name = 'codespec' })[1]
    return client ~= nil and client.initialized
  end, 10), 'codespec did not attach')
  seen.root_dir = client.root_dir
  seen.offset_encoding = client.offset_encoding
  seen.inline_provider = client.server_capabilities.inlineCompletionProvider ~= nil

  -- Ghost text: what vim.lsp.inline_completion asks for. The cursor goes to the end of the last
  -- line, then (should the model have nothing to say there) to the ends of the lines before it.
  local items = {}
  local last = vim.api.nvim_buf_line_count(bufnr)
  for row = last, math.max(1, last - 4), -1 do
    local line = vim.api.nvim_buf_get_lines(bufnr, row - 1, row, true)[1]
    vim.api.nvim_win_set_cursor(0, { row, #line })
    local params = vim.lsp.util.make_position_params(0, client.offset_encoding)
    params.context = { triggerKind = 1 }
    local completion = request(client, 'textDocument/inlineCompletion', params, bufnr)
    items = completion.items or completion
    seen.asked = (seen.asked or 0) + 1
    if #items > 0 then
      break
    end
  end
  seen.items = #items
  seen.item = items[1]

  -- Accepting runs the item's command on the server (codespec.accepted -> session history).
  if items[1] and items[1].command then
    local done = false
    client:exec_cmd(items[1].command, { bufnr = bufnr }, function() done = true end)
    assert(vim.wait(WAIT_MS, function() return done end, 10), 'accept command: no reply')
  end
  seen.stats = request(client, 'codespec/stats', {}, bufnr)

  -- :CodespecRewrite over lines 1-4 (no instruction): deltas stream, the final edits are applied.
  seen.before = vim.api.nvim_buf_get_lines(bufnr, 0, -1, true)
  vim.cmd('1,4CodespecRewrite')
  assert(vim.wait(WAIT_MS, function() return vim.b[bufnr].codespec_rewrite ~= nil end, 10), 'rewrite: no result')
  seen.rewrite = vim.b[bufnr].codespec_rewrite
  seen.after = vim.api.nvim_buf_get_lines(bufnr, 0, -1, true)

  -- A next edit after renaming "side" on the last line, through the real server.
  local codespec = require('codespec')
  local last_row = vim.api.nvim_buf_line_count(bufnr) - 1
  local last_line = vim.api.nvim_buf_get_lines(bufnr, last_row, last_row + 1, true)[1]
  vim.api.nvim_buf_set_text(bufnr, last_row, #last_line, last_row, #last_line, { 'width' })
  vim.api.nvim_win_set_cursor(0, { last_row + 1, #last_line + 5 })
  codespec.next_edit(bufnr)
  assert(vim.wait(WAIT_MS, function()
    local status = codespec.next_edit_status(bufnr)
    return status.edit or status.none or status.error
  end, 10), 'next edit: no reply')
  seen.next_edit = codespec.next_edit_status(bufnr)
  seen.next_edit_version = vim.lsp.util.buf_versions[bufnr]
  if seen.next_edit.edit then
    seen.next_edit_accepted = codespec.accept_next_edit(bufnr)
    seen.after_next_edit = vim.api.nvim_buf_get_lines(bufnr, 0, -1, true)
  end
end)
if not ok then
  seen.failure = tostring(failure)
end
local handle = assert(io.open(out_path, 'w'))
handle:write(vim.json.encode(seen))
handle:close()
for _, client in ipairs(vim.lsp.get_clients()) do
  client:stop()
end
vim.wait(5000, function() return #vim.lsp.get_clients() == 0 end, 10)
