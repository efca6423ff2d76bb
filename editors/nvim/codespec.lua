-- codespec for Neovim >= 0.10: `codespec serve` as a language server, ghost text for its inline
-- completions (textDocument/inlineCompletion) and :CodespecRewrite for streamed rewrites
-- (codespec/edit).
--
--   require('codespec').setup({ cmd = { 'codespec', 'serve' }, init_options = { mode = 'auto' } })
--
-- Ghost text: on Neovim 0.12+ through vim.lsp.inline_completion; on 0.10 / 0.11 this module asks
-- for the inline completion itself (debounced, on InsertEnter / TextChangedI / CursorMovedI, the
-- request in flight cancelled when the user types on) and shows it as extmark virtual text at the
-- cursor: the first line inline, the others as virtual lines. Typing a prefix of the suggestion
-- keeps showing the rest without a new request; leaving insert mode or the buffer clears it.
--
-- Accepting a suggestion (the accept key, <Tab> by default) inserts it (replacing the item's
-- range) and runs the item's command, `codespec.accepted`, which Neovim sends to the server as
-- workspace/executeCommand: accepted text becomes session history that later completions draft from.
--
-- Next edits (textDocument/copilotInlineEdit): after the user changes something, the server's
-- suggestion for the next place the change applies, previewed as a diff (the replaced text
-- highlighted, the new lines below it) and taken with <Tab> in normal mode (:CodespecNextEdit asks,
-- :CodespecNextEditAccept / :CodespecNextEditReject; with `next_edit.auto`, asked after each pause).
-- When the next place is in another file, a hint says where and <Tab> goes there: to the preview,
-- in a buffer open at the version the server named, or, for a file not open yet, opening it and
-- asking there (a second <Tab> applies).
local M = {}

local defaults = {
  cmd = { 'codespec', 'serve' },
  filetypes = {
    'python', 'lua', 'javascript', 'typescript', 'javascriptreact', 'typescriptreact', 'rust', 'go',
    'c', 'cpp', 'java', 'sh', 'ruby', 'toml', 'yaml', 'json', 'markdown',
  },
  root_markers = { '.git', 'pyproject.toml', 'package.json', 'Cargo.toml', 'go.mod' },
  init_options = { mode = 'auto', completionFallback = false },
  capabilities = nil, -- merged over Neovim's own client capabilities
  accept_key = '<Tab>', -- accepts the shown suggestion; falls through to a normal <Tab> otherwise (false: no mapping)
  next_key = '<M-]>', -- 0.12: next suggestion (false: no mapping)
  debounce_ms = 75, -- 0.10 / 0.11 ghost text: quiet time after a keystroke before asking
  next_edit = {
    auto = false, -- ask for the next edit after each pause in editing (TextChanged, InsertLeave)
    debounce_ms = 300,
    accept_key = '<Tab>', -- normal mode, while a preview is shown (false: no mapping)
  },
}

local util = require('codespec.client')
local ghost = require('codespec.ghost')
local next_edit = require('codespec.next_edit')
local call, client_for, lsp_character, execute_command =
  util.call, util.client_for, util.lsp_character, util.execute_command

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
      ['end'] = { line = opts.line2 - 1, character = lsp_character(last, #last, client.offset_encoding) },
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
  call(client, 'request', 'codespec/edit', params, function(err, result)
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

-- The ghost text (0.10 / 0.11) and next edits, as this module's API.
M.suggestion, M.status, M.accept = ghost.suggestion, ghost.status, ghost.accept
M.next_edit, M.next_edit_status = next_edit.next_edit, next_edit.next_edit_status
M.accept_next_edit, M.reject_next_edit = next_edit.accept_next_edit, next_edit.reject_next_edit

-- Neovim 0.10 has no vim.lsp.config / vim.lsp.enable: start the client on FileType.
local function start_on_filetype(opts, server)
  local function start(bufnr)
    if vim.bo[bufnr].buftype ~= '' then
      return
    end
    local config_for_buffer = vim.tbl_extend('force', server, {
      root_dir = vim.fs.root(bufnr, opts.root_markers),
    })
    vim.lsp.start(config_for_buffer, { bufnr = bufnr })
  end
  vim.api.nvim_create_autocmd('FileType', {
    group = vim.api.nvim_create_augroup('codespec_start', { clear = true }),
    pattern = opts.filetypes,
    callback = function(args)
      start(args.buf)
    end,
  })
  for _, bufnr in ipairs(vim.api.nvim_list_bufs()) do
    if vim.api.nvim_buf_is_loaded(bufnr) and vim.tbl_contains(opts.filetypes, vim.bo[bufnr].filetype) then
      start(bufnr)
    end
  end
end

function M.setup(opts)
  opts = vim.tbl_deep_extend('force', defaults, opts or {})
  ghost.configure(opts)
  local server = {
    name = 'codespec',
    cmd = opts.cmd,
    init_options = opts.init_options,
    capabilities = opts.capabilities,
  }
  vim.api.nvim_set_hl(0, 'CodespecSuggestion', { link = 'Comment', default = true })
  vim.api.nvim_set_hl(0, 'CodespecNextEditRemoved', { link = 'DiffDelete', default = true })
  vim.api.nvim_set_hl(0, 'CodespecNextEditAdded', { link = 'DiffAdd', default = true })
  vim.api.nvim_set_hl(0, 'CodespecNextEditElsewhere', { link = 'Comment', default = true })

  vim.api.nvim_create_autocmd('LspAttach', {
    group = vim.api.nvim_create_augroup('codespec', { clear = true }),
    callback = function(args)
      local client = vim.lsp.get_client_by_id(args.data.client_id)
      if not (client and client.name == 'codespec') then
        return
      end
      if vim.lsp.inline_completion then
        vim.lsp.inline_completion.enable(true, { bufnr = args.buf })
      else
        ghost.attach(args.buf)
      end
      next_edit.attach(args.buf, opts.next_edit)
    end,
  })

  if vim.lsp.config then
    vim.lsp.config('codespec', vim.tbl_extend('force', server, {
      filetypes = opts.filetypes,
      root_markers = opts.root_markers,
    }))
    vim.lsp.enable('codespec')
  else
    start_on_filetype(opts, server)
  end

  if opts.accept_key then
    vim.keymap.set('i', opts.accept_key, function()
      if vim.lsp.inline_completion then
        if not vim.lsp.inline_completion.get() then
          return opts.accept_key
        end
        return ''
      end
      if M.suggestion(0) then -- the edit runs after the mapping (no text lock there)
        return '<Cmd>CodespecAccept<CR>'
      end
      return opts.accept_key
    end, { expr = true, replace_keycodes = true, desc = 'codespec: accept suggestion' })
  end
  if opts.next_key and vim.lsp.inline_completion then
    vim.keymap.set('i', opts.next_key, function()
      vim.lsp.inline_completion.select({ count = 1 })
    end, { desc = 'codespec: next suggestion' })
  end

  if opts.next_edit.accept_key then
    vim.keymap.set('n', opts.next_edit.accept_key, function()
      local shown = M.next_edit_status(0)
      if shown.edit or shown.elsewhere then
        return '<Cmd>CodespecNextEditAccept<CR>'
      end
      return opts.next_edit.accept_key
    end, { expr = true, replace_keycodes = true, desc = 'codespec: accept the next edit' })
  end
  vim.api.nvim_create_user_command('CodespecNextEdit', function()
    M.next_edit(0)
  end, { desc = 'codespec: suggest the next edit' })
  vim.api.nvim_create_user_command('CodespecNextEditAccept', function()
    M.accept_next_edit(0)
  end, { desc = 'codespec: apply the shown next edit' })
  vim.api.nvim_create_user_command('CodespecNextEditReject', function()
    M.reject_next_edit(0)
  end, { desc = 'codespec: dismiss the shown next edit' })
  vim.api.nvim_create_user_command('CodespecAccept', function()
    M.accept()
  end, { desc = 'codespec: accept the shown suggestion' })
  vim.api.nvim_create_user_command('CodespecRewrite', rewrite,
    { range = true, nargs = '?', desc = 'codespec: rewrite the range (optional instruction)' })
  vim.api.nvim_create_user_command('CodespecStats', function()
    local client = client_for(0)
    if client then
      call(client, 'request', 'codespec/stats', {}, function(_, stats)
        vim.print(stats)
      end)
    end
  end, { desc = 'codespec: engine statistics' })
  vim.api.nvim_create_user_command('CodespecReindex', function()
    local client = client_for(0)
    if client then
      execute_command(client, { title = 'reindex', command = 'codespec.reindex' }, 0)
    end
  end, { desc = 'codespec: reindex the workspace' })
end

return M
