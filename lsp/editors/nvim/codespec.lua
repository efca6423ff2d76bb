-- codespec for Neovim >= 0.12: `codespec serve` as a language server, ghost text through
-- vim.lsp.inline_completion, and :CodespecRewrite for streamed rewrites (codespec/edit).
-- On 0.11 (no vim.lsp.inline_completion) everything but the ghost text works.
--
--   require('codespec').setup({ cmd = { 'codespec', 'serve' }, init_options = { mode = 'auto' } })
--
-- Accepting a suggestion (vim.lsp.inline_completion.get) runs the item's command,
-- `codespec.accepted`, which Neovim sends to the server as workspace/executeCommand: accepted text
-- becomes session history that later completions draft from.
local M = {}

local defaults = {
  cmd = { 'codespec', 'serve' },
  filetypes = {
    'python', 'lua', 'javascript', 'typescript', 'javascriptreact', 'typescriptreact', 'rust', 'go',
    'c', 'cpp', 'java', 'sh', 'ruby', 'toml', 'yaml', 'json', 'markdown',
  },
  root_markers = { '.git', 'pyproject.toml', 'package.json', 'Cargo.toml', 'go.mod' },
  init_options = { mode = 'auto', completionFallback = false },
  accept_key = '<Tab>', -- accepts the shown suggestion; falls through to a normal <Tab> otherwise
  next_key = '<M-]>',
}

local function client_for(bufnr)
  return vim.lsp.get_clients({ bufnr = bufnr, name = 'codespec' })[1]
end

-- Rewrite the lines [line1, line2] (1-based, inclusive) with an optional instruction. Deltas
-- arrive as codespec/editDelta notifications; the final TextEdits are applied when done.
local function rewrite(opts)
  local bufnr = vim.api.nvim_get_current_buf()
  local client = client_for(bufnr)
  if not client then
    vim.notify('codespec: not attached to this buffer', vim.log.levels.WARN)
    return
  end
  local last = vim.api.nvim_buf_get_lines(bufnr, opts.line2 - 1, opts.line2, true)[1]
  local edit_id = ('nvim-%d'):format(vim.uv.hrtime())
  local params = {
    textDocument = { uri = vim.uri_from_bufnr(bufnr) },
    range = {
      start = { line = opts.line1 - 1, character = 0 },
      ['end'] = { line = opts.line2 - 1, character = vim.str_utfindex(last, client.offset_encoding) },
    },
    instruction = opts.args ~= '' and opts.args or nil,
    editId = edit_id,
  }
  local streamed, received = {}, 0
  client.handlers['codespec/editDelta'] = function(_, delta)
    if delta.editId == edit_id then
      streamed[#streamed + 1] = delta.text
      received = received + #delta.text
      vim.api.nvim_echo({ { ('codespec: rewriting… %d bytes'):format(received) } }, false, {})
    end
  end
  vim.b[bufnr].codespec_rewrite = nil
  client:request('codespec/edit', params, function(err, result)
    if err then
      vim.b[bufnr].codespec_rewrite = { error = err.message }
      vim.notify('codespec: rewrite failed: ' .. err.message, vim.log.levels.ERROR)
      return
    end
    vim.lsp.util.apply_text_edits(result.edits, bufnr, client.offset_encoding)
    local usage = result.usage
    -- The last rewrite's outcome, for statuslines and scripts.
    vim.b[bufnr].codespec_rewrite = { edits = result.edits, streamed = table.concat(streamed), usage = usage }
    vim.api.nvim_echo({ { ('codespec: %d tokens, %d copied from the original'):format(
      usage.completion_tokens, usage.accepted_prediction_tokens) } }, false, {})
  end, bufnr)
end

function M.setup(opts)
  opts = vim.tbl_deep_extend('force', defaults, opts or {})
  vim.lsp.config('codespec', {
    cmd = opts.cmd,
    filetypes = opts.filetypes,
    root_markers = opts.root_markers,
    init_options = opts.init_options,
  })
  vim.lsp.enable('codespec')

  vim.api.nvim_create_autocmd('LspAttach', {
    group = vim.api.nvim_create_augroup('codespec', { clear = true }),
    callback = function(args)
      local client = vim.lsp.get_client_by_id(args.data.client_id)
      if client and client.name == 'codespec' and vim.lsp.inline_completion then
        vim.lsp.inline_completion.enable(true, { bufnr = args.buf })
      end
    end,
  })

  if not vim.lsp.inline_completion then
    vim.notify('codespec: ghost text needs Neovim 0.12 (vim.lsp.inline_completion); rewrites work',
      vim.log.levels.WARN)
  end
  vim.keymap.set('i', opts.accept_key, function()
    if not (vim.lsp.inline_completion and vim.lsp.inline_completion.get()) then
      return opts.accept_key
    end
  end, { expr = true, replace_keycodes = true, desc = 'codespec: accept suggestion' })
  vim.keymap.set('i', opts.next_key, function()
    if vim.lsp.inline_completion then
      vim.lsp.inline_completion.select({ count = 1 })
    end
  end, { desc = 'codespec: next suggestion' })

  vim.api.nvim_create_user_command('CodespecRewrite', rewrite,
    { range = true, nargs = '?', desc = 'codespec: rewrite the range (optional instruction)' })
  vim.api.nvim_create_user_command('CodespecStats', function()
    local client = client_for(0)
    if client then
      client:request('codespec/stats', {}, function(_, stats)
        vim.print(stats)
      end)
    end
  end, { desc = 'codespec: engine statistics' })
  vim.api.nvim_create_user_command('CodespecReindex', function()
    local client = client_for(0)
    if client then
      client:exec_cmd({ title = 'reindex', command = 'codespec.reindex' })
    end
  end, { desc = 'codespec: reindex the workspace' })
end

return M
