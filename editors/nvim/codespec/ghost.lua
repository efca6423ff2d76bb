-- codespec's ghost text for Neovim 0.10 / 0.11 (0.12 has vim.lsp.inline_completion): asked for
-- after a pause in typing, shown at the cursor, accepted with the accept key (editors/nvim/codespec.lua).
local util = require('codespec.client')
local call, client_for, byte_index, execute_command, on_detach =
  util.call, util.client_for, util.byte_index, util.execute_command, util.on_detach

local G = {}
local config = { debounce_ms = 75 } -- the module's options (codespec.setup hands them over)

function G.configure(opts)
  config = opts
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
function G.suggestion(bufnr)
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
function G.status(bufnr)
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
function G.accept()
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

G.attach = attach_ghost

return G
