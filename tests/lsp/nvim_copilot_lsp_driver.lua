-- copilot-lsp (the Neovim client for Copilot's language server, vendored in tests/lsp/vendor) with
-- its next-edit module pointed at a real `codespec serve` (tests/lsp/test_copilot_lsp_client.py):
-- the user renames a name at its two uses, copilot-lsp asks for the next edit, shows its preview
-- and applies it as its README's <Tab> does (walk to the edit, apply it).
--   CODESPEC_NVIM_TEST='{"repo", "out", "file", "python"}' nvim --headless --clean -S nvim_copilot_lsp_driver.lua
local H = dofile(vim.json.decode(vim.env.CODESPEC_NVIM_TEST).repo .. '/tests/lsp/nvim_harness.lua')
local config = H.config
local vendor = config.repo .. '/tests/lsp/vendor/copilot-lsp/lua/'
package.path = vendor .. '?.lua;' .. vendor .. '?/init.lua;' .. package.path

local function lines(bufnr)
  return vim.api.nvim_buf_get_lines(bufnr, 0, -1, true)
end

H.run(function(seen)
  require('copilot-lsp').setup({})
  require('copilot-lsp.util').set_hl()
  local nes = require('copilot-lsp.nes')
  vim.cmd.edit(config.file)
  local bufnr = vim.api.nvim_get_current_buf()
  vim.lsp.start({
    name = 'codespec',
    cmd = { config.python, '-m', 'codespec.commands.cli', 'serve' },
    root_dir = vim.fs.dirname(config.file),
    init_options = { device = 'cpu' },
  }, { bufnr = bufnr })
  local client = H.attach(bufnr)

  -- the user renames area_of_square at both its uses (change-word, as typed)
  H.keys('gg0wciwsquare_area<Esc>')
  H.wait_for('the first rename', function() return H.line(bufnr, 1):find('square_area', 1, true) end)
  H.keys('6G0f,wciwsquare_area<Esc>')
  H.wait_for('the second rename', function() return H.line(bufnr, 6):find('square_area', 1, true) end)
  H.wait_for('normal mode', function() return H.mode() == 'n' end)
  seen.before = lines(bufnr)
  seen.cursor = H.cursor()

  -- copilot-lsp asks (its debounced TextChanged request does the same) and shows what comes back
  local answered
  local request = client.request
  client.request = function(self, method, params, handler, ...)
    if method == 'textDocument/copilotInlineEdit' then
      seen.params = params
      return request(self, method, params, function(err, result, ctx)
        answered = { err = err, result = result }
        return handler(err, result, ctx)
      end, ...)
    end
    return request(self, method, params, handler, ...)
  end
  nes.request_nes(client)
  H.wait_for('the answer', function() return answered end, 120000)
  seen.answer = answered
  if not (answered.result and answered.result.edits and answered.result.edits[1]) then
    return
  end
  H.wait_for('the preview', function() return vim.b[bufnr].nes_state end)
  seen.state = vim.b[bufnr].nes_state
  local ns = vim.api.nvim_get_namespaces()['copilotlsp.nes']
  seen.marks = #vim.api.nvim_buf_get_extmarks(bufnr, ns, 0, -1, {})
  H.wait_for('didShowInlineEdit', function() return true end)

  -- its README's <Tab>: walk to the edit's start, then apply it
  local walked = nes.walk_cursor_start_edit()
  H.settle()
  local applied = nes.apply_pending_nes()
  H.wait_for('the applied edit', function() return vim.b[bufnr].nes_state == nil end)
  H.settle()
  seen.walked, seen.applied, seen.after = walked, applied, lines(bufnr)
end)
