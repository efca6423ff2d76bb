-- codespec's next edits in Neovim (textDocument/copilotInlineEdit): asked at the cursor, previewed
-- as a diff, applied with <Tab>; an edit in another file is a hint, and <Tab> goes there first
-- (editors/nvim/codespec.lua sets up the keys and commands; docs/next-edit.md).
local util = require('codespec.client')
local call, client_for, byte_index, execute_command, on_detach =
  util.call, util.client_for, util.byte_index, util.execute_command, util.on_detach

local N = {}

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
function N.next_edit(bufnr)
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
function N.next_edit_status(bufnr)
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
      N.next_edit(target)
    else
      vim.api.nvim_create_autocmd('LspAttach', {
        buffer = target,
        once = true,
        callback = function() N.next_edit(target) end,
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
function N.accept_next_edit(bufnr)
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

function N.reject_next_edit(bufnr)
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
            N.next_edit(bufnr)
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

N.attach = attach_next_edit

return N
