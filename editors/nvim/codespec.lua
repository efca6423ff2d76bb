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

local has_011 = vim.fn.has('nvim-0.11') == 1
local config = vim.deepcopy(defaults)

-- Client methods are called with `:` from 0.11 on, with `.` before.
local function call(client, method, ...)
  if has_011 then
    return client[method](client, ...)
  end
  return client[method](...)
end

local function client_for(bufnr)
  return vim.lsp.get_clients({ bufnr = bufnr, name = 'codespec' })[1]
end

-- LSP character offset (in `encoding` units) of byte index `byte` of `line`, and back.
local function lsp_character(line, byte, encoding)
  byte = math.min(byte, #line)
  if encoding == 'utf-8' then
    return byte
  end
  if has_011 then
    return vim.str_utfindex(line, encoding, byte, false)
  end
  local utf32, utf16 = vim.str_utfindex(line, byte)
  return encoding == 'utf-16' and utf16 or utf32
end

local function byte_index(line, character, encoding)
  if encoding == 'utf-8' then
    return math.min(character, #line)
  end
  if has_011 then
    return vim.str_byteindex(line, encoding, character, false)
  end
  local ok, index = pcall(vim.str_byteindex, line, character, encoding == 'utf-16')
  return ok and index or #line
end

local function execute_command(client, command, bufnr)
  if has_011 then
    client:exec_cmd(command, { bufnr = bufnr })
  else
    client.request('workspace/executeCommand', { command = command.command, arguments = command.arguments },
      function() end, bufnr)
  end
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

---------------------------------------------------------------------------------------------------
-- Ghost text for Neovim 0.10 / 0.11 (no vim.lsp.inline_completion).
--
-- Per buffer: a debounce timer, the request in flight, and the shown item. The item's range is
-- tracked by two extmarks in `anchor_ns` (start: left gravity, end: right gravity), so it follows
-- the user's typing; what the user typed since the range start must be a prefix of insertText, and
-- the rest of insertText is what is shown (and what is left to insert on acceptance).
---------------------------------------------------------------------------------------------------
local ghost_ns = vim.api.nvim_create_namespace('codespec_ghost')
local anchor_ns = vim.api.nvim_create_namespace('codespec_ghost_anchor')
local ghosts = {} -- bufnr -> state

local function state(bufnr)
  local st = ghosts[bufnr]
  if not st then
    st = { timer = assert(vim.uv.new_timer()) }
    ghosts[bufnr] = st
  end
  return st
end

local function cancel_request(st)
  local request = st.request
  st.request = nil
  if request and request.id and not call(request.client, 'is_stopped') then
    call(request.client, 'cancel_request', request.id)
  end
end

local function hide(bufnr, st)
  st.item, st.rest, st.client = nil, nil, nil
  if vim.api.nvim_buf_is_valid(bufnr) then
    vim.api.nvim_buf_clear_namespace(bufnr, ghost_ns, 0, -1)
    vim.api.nvim_buf_clear_namespace(bufnr, anchor_ns, 0, -1)
  end
end

-- Stop everything for the buffer: the timer, the request in flight, the shown suggestion.
local function stop(bufnr)
  local st = ghosts[bufnr]
  if st then
    st.timer:stop()
    cancel_request(st)
    hide(bufnr, st)
    st.seen, st.seen_tick = nil, nil
  end
end

local function mark_pos(bufnr, id)
  local pos = vim.api.nvim_buf_get_extmark_by_id(bufnr, anchor_ns, id, {})
  return pos[1], pos[2]
end

local function insert_text(item)
  local text = item.insertText
  if type(text) == 'table' then -- a StringValue (snippet): shown and inserted as plain text
    text = text.value
  end
  return type(text) == 'string' and text or ''
end

-- The rest of the item still to insert at the cursor, or nil when the buffer no longer agrees
-- with it (the cursor left the range, or the user typed something else).
local function rest_of(bufnr, st)
  if not st.item or vim.api.nvim_get_current_buf() ~= bufnr then
    return nil
  end
  local srow, scol = mark_pos(bufnr, st.start_mark)
  local cursor = vim.api.nvim_win_get_cursor(0)
  local crow, ccol = cursor[1] - 1, cursor[2]
  if not srow or crow < srow or (crow == srow and ccol < scol) then
    return nil
  end
  local typed = table.concat(vim.api.nvim_buf_get_text(bufnr, srow, scol, crow, ccol, {}), '\n')
  local text = insert_text(st.item)
  if text:sub(1, #typed) ~= typed or #typed >= #text then
    return nil
  end
  return text:sub(#typed + 1)
end

local function display(bufnr, text)
  local tab = string.rep(' ', vim.bo[bufnr].tabstop)
  return (text:gsub('\t', tab))
end

-- Draw `rest` at the cursor. The first line goes inline at the cursor, the others as virtual lines
-- below it. Where text after the cursor would move (a multi-line suggestion, or an item whose range
-- replaces text after the cursor), the first line is drawn over the rest of the line instead and
-- what remains of that line is drawn after the last suggested line: a preview of the result.
local function draw(bufnr, st, rest)
  local cursor = vim.api.nvim_win_get_cursor(0)
  local crow, ccol = cursor[1] - 1, cursor[2]
  local line = vim.api.nvim_buf_get_lines(bufnr, crow, crow + 1, true)[1]
  local erow, ecol = mark_pos(bufnr, st.end_mark)
  local replaced_to = (erow == crow and ecol > ccol) and ecol or ccol
  local tail = line:sub(replaced_to + 1)
  local lines = vim.split(rest, '\n', { plain = true })
  local hl = 'CodespecSuggestion'
  local opts = { id = st.ghost_mark, priority = 1000 }
  local moves = replaced_to > ccol or (#lines > 1 and tail ~= '')
  if moves then
    local first = display(bufnr, lines[1])
    local chunks = { { first, hl } }
    if #lines == 1 then
      chunks[2] = { display(bufnr, tail) }
    end
    local covered = vim.fn.strdisplaywidth(line:sub(ccol + 1))
    local width = vim.fn.strdisplaywidth(first .. (#lines == 1 and display(bufnr, tail) or ''))
    if covered > width then
      chunks[#chunks + 1] = { string.rep(' ', covered - width) }
    end
    opts.virt_text, opts.virt_text_pos = chunks, 'overlay'
  elseif lines[1] ~= '' then
    opts.virt_text, opts.virt_text_pos = { { display(bufnr, lines[1]), hl } }, 'inline'
  end
  if #lines > 1 then
    local virt_lines = {}
    for i = 2, #lines do
      virt_lines[#virt_lines + 1] = { { display(bufnr, lines[i]), hl } }
    end
    if moves and tail ~= '' then
      table.insert(virt_lines[#virt_lines], { display(bufnr, tail) })
    end
    opts.virt_lines = virt_lines
  end
  st.ghost_mark = vim.api.nvim_buf_set_extmark(bufnr, ghost_ns, crow, ccol, opts)
  st.rest = rest
end

-- Show what is left of the current item; false (and nothing shown) when nothing is.
local function refresh(bufnr, st)
  local rest = rest_of(bufnr, st)
  if not rest then
    hide(bufnr, st)
    return false
  end
  draw(bufnr, st, rest)
  return true
end

local function in_insert_mode()
  return vim.api.nvim_get_mode().mode:sub(1, 1) == 'i'
end

local function on_reply(bufnr, st, request, err, result)
  if st.request ~= request then -- cancelled or superseded
    return
  end
  st.request = nil
  if err or type(result) ~= 'table' or not vim.api.nvim_buf_is_valid(bufnr) then
    return
  end
  local cursor = vim.api.nvim_win_get_cursor(0)
  if vim.api.nvim_get_current_buf() ~= bufnr or not in_insert_mode()
      or vim.api.nvim_buf_get_changedtick(bufnr) ~= request.tick
      or cursor[1] ~= request.cursor[1] or cursor[2] ~= request.cursor[2] then
    return -- the buffer moved on; a new request is on its way
  end
  local encoding = request.client.offset_encoding or 'utf-16'
  local function position(pos)
    local line = vim.api.nvim_buf_get_lines(bufnr, pos.line, pos.line + 1, false)[1]
    if not line then
      return nil
    end
    return pos.line, byte_index(line, pos.character, encoding)
  end
  for _, item in ipairs(result.items or result) do
    if insert_text(item) ~= '' then
      hide(bufnr, st)
      local srow, scol, erow, ecol = cursor[1] - 1, cursor[2], cursor[1] - 1, cursor[2]
      if item.range then
        srow, scol = position(item.range.start)
        erow, ecol = position(item.range['end'])
      end
      if srow and erow then
        st.start_mark = vim.api.nvim_buf_set_extmark(bufnr, anchor_ns, srow, scol, { right_gravity = false })
        st.end_mark = vim.api.nvim_buf_set_extmark(bufnr, anchor_ns, erow, ecol, { right_gravity = true })
        st.item, st.client = item, request.client
        if refresh(bufnr, st) then
          return
        end
      end
    end
  end
end

local function ask(bufnr)
  local st = ghosts[bufnr]
  if not st or vim.api.nvim_get_current_buf() ~= bufnr or not in_insert_mode() then
    return
  end
  local client = client_for(bufnr)
  if not client then
    return
  end
  cancel_request(st)
  local params = vim.lsp.util.make_position_params(0, client.offset_encoding or 'utf-16')
  params.context = { triggerKind = 2 } -- Automatic
  local request = {
    client = client,
    tick = vim.api.nvim_buf_get_changedtick(bufnr),
    cursor = vim.api.nvim_win_get_cursor(0),
  }
  st.request = request
  local ok, id = call(client, 'request', 'textDocument/inlineCompletion', params, function(err, result)
    on_reply(bufnr, st, request, err, result)
  end, bufnr)
  if ok and id then
    request.id = id
  elseif st.request == request then
    st.request = nil
  end
end

local function schedule(bufnr, st)
  st.timer:stop()
  st.timer:start(config.debounce_ms, 0, vim.schedule_wrap(function()
    ask(bufnr)
  end))
end

-- TextChangedI / CursorMovedI: keep showing the rest of the item if the user typed along it,
-- otherwise drop it, cancel the request in flight and ask again after the debounce.
local function on_change(bufnr)
  local st = state(bufnr)
  local cursor = vim.api.nvim_win_get_cursor(0)
  local seen = ('%d:%d:%d'):format(vim.api.nvim_buf_get_changedtick(bufnr), cursor[1], cursor[2])
  if st.seen == seen then -- both events fire for one keystroke
    return
  end
  local tick = vim.api.nvim_buf_get_changedtick(bufnr)
  local moved_only = st.seen_tick == tick -- the cursor moved without an edit: not typing along
  st.seen, st.seen_tick = seen, tick
  if st.item and not moved_only and refresh(bufnr, st) then
    return
  end
  hide(bufnr, st)
  cancel_request(st)
  schedule(bufnr, st)
end

--- The suggestion shown in `bufnr` (0.10 / 0.11 ghost text): { text = what is left to insert,
--- item = the InlineCompletionItem }, or nil.
function M.suggestion(bufnr)
  bufnr = (bufnr == nil or bufnr == 0) and vim.api.nvim_get_current_buf() or bufnr
  local st = ghosts[bufnr]
  if st and st.item and st.rest then
    return { text = st.rest, item = st.item }
  end
  return nil
end

--- Where the 0.10 / 0.11 ghost text of `bufnr` stands, for statuslines and scripts:
--- { shown = the text left to insert or nil, scheduled = a request waits for the debounce,
---   requesting = a request is in flight }.
function M.status(bufnr)
  bufnr = (bufnr == nil or bufnr == 0) and vim.api.nvim_get_current_buf() or bufnr
  local st = ghosts[bufnr]
  if not st then
    return { scheduled = false, requesting = false }
  end
  return {
    shown = st.item and st.rest or nil,
    scheduled = st.timer:is_active(),
    requesting = st.request ~= nil,
  }
end

--- Accept the shown suggestion: insert it at the cursor (replacing the item's range) and run its
--- command. Returns false when there is none. On 0.12 this is vim.lsp.inline_completion.get().
function M.accept()
  if vim.lsp.inline_completion then
    return vim.lsp.inline_completion.get() and true or false
  end
  local bufnr = vim.api.nvim_get_current_buf()
  local st = ghosts[bufnr]
  local rest = st and rest_of(bufnr, st)
  if not rest then
    return false
  end
  local item, client = st.item, st.client
  local srow, scol = mark_pos(bufnr, st.start_mark)
  local erow, ecol = mark_pos(bufnr, st.end_mark)
  local cursor = vim.api.nvim_win_get_cursor(0)
  local crow, ccol = cursor[1] - 1, cursor[2]
  if erow < crow or (erow == crow and ecol < ccol) then -- typed past the range's end: that is replaced too
    erow, ecol = crow, ccol
  end
  st.timer:stop()
  cancel_request(st)
  hide(bufnr, st)
  local lines = vim.split(insert_text(item), '\n', { plain = true })
  vim.api.nvim_buf_set_text(bufnr, srow, scol, erow, ecol, lines)
  local row = srow + #lines - 1
  local col = (#lines == 1 and scol or 0) + #lines[#lines]
  vim.api.nvim_win_set_cursor(0, { row + 1, col })
  if item.command and client and not call(client, 'is_stopped') then
    execute_command(client, item.command, bufnr)
  end
  return true
end

-- Run `cleanup` once codespec detaches from the buffer or the buffer is wiped (another server's
-- detach is not ours), then drop the buffer's autocommand group.
local function on_detach(bufnr, group, cleanup)
  vim.api.nvim_create_autocmd({ 'LspDetach', 'BufWipeout' }, {
    group = group,
    buffer = bufnr,
    callback = function(args)
      if args.event == 'LspDetach' then
        local client = vim.lsp.get_client_by_id(args.data.client_id)
        if not client or client.name ~= 'codespec' then
          return
        end
      end
      cleanup()
      pcall(vim.api.nvim_del_augroup_by_id, group)
    end,
  })
end

local function attach_ghost(bufnr)
  local group = vim.api.nvim_create_augroup(('codespec_ghost_%d'):format(bufnr), { clear = true })
  state(bufnr)
  vim.api.nvim_create_autocmd('InsertEnter', {
    group = group,
    buffer = bufnr,
    callback = function()
      local st = state(bufnr)
      st.seen, st.seen_tick = nil, nil
      schedule(bufnr, st)
    end,
  })
  vim.api.nvim_create_autocmd({ 'TextChangedI', 'CursorMovedI' }, {
    group = group,
    buffer = bufnr,
    callback = function()
      on_change(bufnr)
    end,
  })
  vim.api.nvim_create_autocmd({ 'InsertLeave', 'BufLeave' }, {
    group = group,
    buffer = bufnr,
    callback = function()
      stop(bufnr)
    end,
  })
  on_detach(bufnr, group, function()
    stop(bufnr)
    local st = ghosts[bufnr]
    ghosts[bufnr] = nil
    if st and not st.timer:is_closing() then
      st.timer:close()
    end
  end)
end

---------------------------------------------------------------------------------------------------
-- Next edits. Per buffer: the request in flight and the suggestion shown, with the buffer's LSP
-- version and changedtick when it was asked; a reply for a buffer that has changed since is
-- dropped, and accepting checks again, so a suggestion for a stale version is never applied. A
-- reply naming another document is never applied here: it is shown as a hint (`elsewhere`), and
-- accepting it goes to that document first.
---------------------------------------------------------------------------------------------------
local next_ns = vim.api.nvim_create_namespace('codespec_next_edit')
local next_edits = {} -- bufnr -> { client, version, tick, request, edit, elsewhere, none, error }

local function buffer_version(bufnr)
  local versions = vim.lsp.util.buf_versions
  return versions and versions[bufnr] or vim.b[bufnr].changedtick
end

local function clear_next_edit(bufnr)
  local st = next_edits[bufnr]
  next_edits[bufnr] = nil
  if st and st.request and not call(st.client, 'is_stopped') then
    call(st.client, 'cancel_request', st.request)
  end
  if vim.api.nvim_buf_is_valid(bufnr) then
    vim.api.nvim_buf_clear_namespace(bufnr, next_ns, 0, -1)
  end
end

-- The edit's range as 0-based (row, byte column) pairs, and the lines the range becomes.
local function next_edit_lines(bufnr, client, edit)
  local first, last = edit.range.start, edit.range['end']
  local lines = vim.api.nvim_buf_get_lines(bufnr, first.line, last.line + 1, false)
  local head, tail = lines[1] or '', lines[#lines] or ''
  local start_col = byte_index(head, first.character, client.offset_encoding)
  local end_col = byte_index(tail, last.character, client.offset_encoding)
  local new_lines = vim.split(head:sub(1, start_col) .. edit.text .. tail:sub(end_col + 1), '\n', { plain = true })
  return start_col, end_col, new_lines
end

local function show_next_edit(bufnr, client, edit)
  local first, last = edit.range.start, edit.range['end']
  local start_col, end_col, new_lines = next_edit_lines(bufnr, client, edit)
  if first.line ~= last.line or start_col ~= end_col then
    vim.api.nvim_buf_set_extmark(bufnr, next_ns, first.line, start_col,
      { end_row = last.line, end_col = end_col, hl_group = 'CodespecNextEditRemoved' })
  end
  local virt_lines = {}
  for _, line in ipairs(new_lines) do
    virt_lines[#virt_lines + 1] = { { line, 'CodespecNextEditAdded' } }
  end
  vim.api.nvim_buf_set_extmark(bufnr, next_ns, last.line, 0, { virt_lines = virt_lines })
end

-- Whether `uri` is the buffer's (the server may spell a file's URI otherwise than Neovim does).
local function names_buffer(uri, bufnr)
  return uri == vim.uri_from_bufnr(bufnr)
    or (uri:match('^file:') ~= nil and vim.uri_to_fname(uri) == vim.api.nvim_buf_get_name(bufnr))
end

-- A next edit in another document: where, at the end of the cursor's line.
local function show_elsewhere(bufnr, edit)
  local name = vim.fn.fnamemodify(vim.uri_to_fname(edit.textDocument.uri), ':~:.')
  local where = ('next edit: %s:%d (<Tab> goes there)'):format(name, edit.range.start.line + 1)
  local row = vim.api.nvim_win_get_cursor(0)[1] - 1
  if vim.api.nvim_get_current_buf() ~= bufnr then
    row = 0
  end
  vim.api.nvim_buf_set_extmark(bufnr, next_ns, row, 0,
    { virt_text = { { where, 'CodespecNextEditElsewhere' } }, virt_text_pos = 'eol' })
end

-- Ask for the next edit at the cursor (replacing any shown or pending one).
function M.next_edit(bufnr)
  bufnr = (bufnr == nil or bufnr == 0) and vim.api.nvim_get_current_buf() or bufnr
  clear_next_edit(bufnr)
  local client = client_for(bufnr)
  if not client then
    return
  end
  local params = vim.lsp.util.make_position_params(0, client.offset_encoding)
  local st = { client = client, version = buffer_version(bufnr), tick = vim.b[bufnr].changedtick }
  params.textDocument.version = st.version
  params.otherDocuments = true -- an edit in another file is taken (a hint, then go_to_elsewhere)
  next_edits[bufnr] = st
  local ok, id = call(client, 'request', 'textDocument/copilotInlineEdit', params, function(err, result)
    if next_edits[bufnr] ~= st then
      return -- superseded or dismissed
    end
    st.request = nil
    if err then
      st.error = err.message
      return
    end
    local edit = result and result.edits and result.edits[1]
    if not edit or vim.b[bufnr].changedtick ~= st.tick then
      st.none = true
      return
    end
    local uri = edit.textDocument and edit.textDocument.uri
    if uri and not names_buffer(uri, bufnr) then
      st.elsewhere = edit -- another document: a hint here, <Tab> goes there
      show_elsewhere(bufnr, edit)
      return
    end
    if edit.textDocument and edit.textDocument.version ~= buffer_version(bufnr) then
      st.none = true
      return
    end
    st.edit = edit
    show_next_edit(bufnr, client, edit)
    call(client, 'notify', 'textDocument/didShowInlineEdit', { item = { command = edit.command } })
  end, bufnr)
  st.request = ok and id or nil
end

-- What the next-edit machinery shows for the buffer (for statuslines and tests).
function M.next_edit_status(bufnr)
  local st = next_edits[(bufnr == nil or bufnr == 0) and vim.api.nvim_get_current_buf() or bufnr]
  if not st then
    return {}
  end
  return { pending = st.request ~= nil, edit = st.edit, elsewhere = st.elsewhere, none = st.none, error = st.error }
end

-- Go to a next edit in another document: a buffer open at the version the server named shows its
-- preview; a file the server read from disk (version null) is opened and asked about where the
-- edit starts (the server has that answer ready). Anything else is stale and dropped.
local function go_to_elsewhere(client, edit)
  local uri, version = edit.textDocument.uri, edit.textDocument.version
  local target = vim.uri_to_bufnr(uri)
  local unversioned = version == nil or version == vim.NIL
  if vim.api.nvim_buf_is_loaded(target) then
    if unversioned or buffer_version(target) ~= version then
      vim.notify('codespec: the next edit is for another version of ' .. vim.uri_to_fname(uri), vim.log.levels.INFO)
      return false
    end
    vim.api.nvim_win_set_buf(0, target)
  elseif unversioned then
    local ok, err = pcall(vim.cmd.edit, vim.fn.fnameescape(vim.uri_to_fname(uri)))
    if not ok then
      vim.notify('codespec: could not open the next edit\'s file: ' .. tostring(err), vim.log.levels.WARN)
      return false
    end
    target = vim.api.nvim_get_current_buf()
  else
    return false -- the server saw it open, the editor does not have it: stale
  end
  local start = edit.range.start
  local line = vim.api.nvim_buf_get_lines(target, start.line, start.line + 1, false)[1] or ''
  pcall(vim.api.nvim_win_set_cursor, 0, { start.line + 1, byte_index(line, start.character, client.offset_encoding) })
  if unversioned then -- opened just now: ask there once the client has sent didOpen
    if client_for(target) then
      M.next_edit(target)
    else
      vim.api.nvim_create_autocmd('LspAttach', {
        buffer = target,
        once = true,
        callback = function() M.next_edit(target) end,
      })
    end
    return true
  end
  clear_next_edit(target)
  next_edits[target] = { client = client, version = version, tick = vim.b[target].changedtick, edit = edit }
  show_next_edit(target, client, edit)
  call(client, 'notify', 'textDocument/didShowInlineEdit', { item = { command = edit.command } })
  return true
end

-- Apply the shown next edit (false when there is none, or the buffer changed since it was asked).
function M.accept_next_edit(bufnr)
  bufnr = (bufnr == nil or bufnr == 0) and vim.api.nvim_get_current_buf() or bufnr
  local st = next_edits[bufnr]
  if st and st.elsewhere then
    clear_next_edit(bufnr)
    return go_to_elsewhere(st.client, st.elsewhere)
  end
  if not (st and st.edit) then
    return false
  end
  local edit, client = st.edit, st.client
  local current = vim.b[bufnr].changedtick == st.tick and buffer_version(bufnr) == st.version
  clear_next_edit(bufnr)
  if not current then
    return false
  end
  local start_col = next_edit_lines(bufnr, client, edit)
  vim.lsp.util.apply_text_edits({ { range = edit.range, newText = edit.text } }, bufnr, client.offset_encoding)
  -- the cursor goes to the end of the applied text, as Copilot's next edits do (the next
  -- suggestion is asked from there, and was speculated from there)
  local lines = vim.split(edit.text, '\n', { plain = true })
  local row = edit.range.start.line + #lines - 1
  local col = (#lines == 1 and start_col or 0) + #lines[#lines]
  if vim.api.nvim_get_current_buf() == bufnr then
    pcall(vim.api.nvim_win_set_cursor, 0, { row + 1, col })
  end
  if edit.command and not call(client, 'is_stopped') then
    execute_command(client, edit.command, bufnr)
  end
  return true
end

function M.reject_next_edit(bufnr)
  clear_next_edit((bufnr == nil or bufnr == 0) and vim.api.nvim_get_current_buf() or bufnr)
end

local function attach_next_edit(bufnr, opts)
  local group = vim.api.nvim_create_augroup(('codespec_next_edit_%d'):format(bufnr), { clear = true })
  local timer = vim.uv.new_timer()
  vim.api.nvim_create_autocmd({ 'TextChanged', 'TextChangedI', 'InsertLeave' }, {
    group = group,
    buffer = bufnr,
    callback = function(args)
      local st = next_edits[bufnr]
      if args.event ~= 'InsertLeave' and not (st and st.tick == vim.b[bufnr].changedtick) then
        clear_next_edit(bufnr) -- a shown suggestion is for the text before this change
      end
      if opts.auto and args.event ~= 'TextChangedI' then
        timer:stop()
        timer:start(opts.debounce_ms, 0, vim.schedule_wrap(function()
          if vim.api.nvim_buf_is_valid(bufnr) and vim.api.nvim_get_current_buf() == bufnr then
            M.next_edit(bufnr)
          end
        end))
      end
    end,
  })
  on_detach(bufnr, group, function()
    clear_next_edit(bufnr)
    if not timer:is_closing() then
      timer:close()
    end
  end)
end

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
  config = opts
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
        attach_ghost(args.buf)
      end
      attach_next_edit(args.buf, opts.next_edit)
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
