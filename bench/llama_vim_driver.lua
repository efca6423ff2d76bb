-- Drives the llama.vim plugin (loaded from a folder outside this repository) in headless Neovim as
-- a user would: open a helper file and the file to edit (the plugin gathers chunks of both for its
-- ring buffer and sends them with n_predict 0), wait in normal mode, go to a line, type, wait for the
-- ghost text, accept it with <Tab>. Records what the buffer and the plugin's extmarks showed.
-- bench/llama_vim.py runs it:
--   LLAMA_VIM_RUN='{"plugin", "url", "token", "helper", "file", "row", "typed", "out"}' nvim --headless --clean -S THIS
local config = vim.json.decode((assert(vim.env.LLAMA_VIM_RUN, 'LLAMA_VIM_RUN is not set')))
local seen = { nvim = tostring(vim.version()) }
local co

local function finish(failure)
  seen.failure = failure
  seen.errmsg = vim.v.errmsg
  seen.messages = vim.api.nvim_exec2('messages', { output = true }).output
  local handle = assert(io.open(config.out, 'w'))
  handle:write(vim.json.encode(seen))
  handle:close()
  vim.cmd('qall!')
end

local function step()
  local ok, err = coroutine.resume(co)
  if not ok then
    finish(debug.traceback(co, tostring(err)))
  elseif coroutine.status(co) == 'dead' then
    finish(nil)
  end
end

-- Yield to the main loop (keys, timers, job callbacks run) until cond() is truthy.
local function wait_for(what, cond, ms)
  local deadline = vim.uv.hrtime() + (ms or 60000) * 1e6
  while true do
    local value = cond()
    if value then
      return value
    end
    if vim.uv.hrtime() > deadline then
      error('timed out waiting for ' .. what, 2)
    end
    vim.defer_fn(step, 10)
    coroutine.yield()
  end
end

local function pause(ms)
  local until_ns = vim.uv.hrtime() + ms * 1e6
  wait_for(ms .. ' ms', function() return vim.uv.hrtime() >= until_ns end, ms + 5000)
end

-- The plugin's ghost text: its extmarks in the 'vt_fim' namespace (virt_text at the cursor,
-- virt_lines below it).
local function ghost(bufnr)
  local ns = vim.api.nvim_get_namespaces().vt_fim
  if not ns then
    return nil
  end
  local first, lines = nil, {}
  for _, mark in ipairs(vim.api.nvim_buf_get_extmarks(bufnr, ns, 0, -1, { details = true })) do
    local details = mark[4]
    if details.virt_text and details.virt_text[1] and details.virt_text[1][1] ~= '' then
      first = details.virt_text[1][1]
    end
    for _, line in ipairs(details.virt_lines or {}) do
      lines[#lines + 1] = line[1] and line[1][1] or ''
    end
  end
  if first == nil and #lines == 0 then
    return nil
  end
  return { first_line = first, more_lines = lines }
end

co = coroutine.create(function()
  vim.g.llama_config = {
    endpoint_fim = config.url .. '/infill',
    api_key = config.token,
    show_info = 0,
  }
  vim.opt.runtimepath:append(config.plugin)
  vim.cmd('runtime plugin/llama.vim')
  seen.plugin_loaded = vim.fn.exists('*llama#fim') == 1

  -- 1. The helper file, then the file to edit: each BufEnter / BufLeave queues a chunk.
  vim.cmd.edit(config.helper)
  pause(400)
  vim.cmd.edit(config.file)
  local bufnr = vim.api.nvim_get_current_buf()
  vim.bo[bufnr].expandtab = true
  -- 2. Normal mode for a while: the ring buffer's timer hands the queued chunks over (n_predict 0).
  pause(3500)

  -- 3. Insert mode at the end of a line, then a new line typed as a user would.
  vim.api.nvim_win_set_cursor(0, { config.row, 0 })
  seen.line_before = vim.api.nvim_buf_get_lines(bufnr, config.row - 1, config.row, true)[1]
  vim.api.nvim_feedkeys('A', 'nt', false)
  wait_for('insert mode', function() return vim.api.nvim_get_mode().mode == 'i' end)
  for index = 1, #config.typed do
    vim.api.nvim_feedkeys(config.typed:sub(index, index), 'nt', false)
    pause(60)
  end
  local started = vim.uv.hrtime()
  seen.shown = wait_for('the ghost text', function() return ghost(bufnr) end, 120000)
  seen.shown_after_ms = (vim.uv.hrtime() - started) / 1e6
  seen.cursor = vim.api.nvim_win_get_cursor(0)
  seen.lines_before_accept = vim.api.nvim_buf_line_count(bufnr)
  local row = seen.cursor[1]
  seen.line_at_cursor = vim.api.nvim_buf_get_lines(bufnr, row - 1, row, true)[1]

  -- 4. <Tab> accepts (the plugin's mapping): the suggestion lands in the buffer, the ghost text goes.
  vim.api.nvim_feedkeys(vim.keycode('<Tab>'), 'mt', false)
  wait_for('the accepted suggestion', function()
    return vim.api.nvim_buf_get_lines(bufnr, row - 1, row, true)[1] ~= seen.line_at_cursor
      or vim.api.nvim_buf_line_count(bufnr) ~= seen.lines_before_accept
  end, 10000)
  local count = #seen.shown.more_lines + 1
  seen.accepted_lines = vim.api.nvim_buf_get_lines(bufnr, row - 1, row - 1 + count, false)
  seen.mode_after_accept = vim.api.nvim_get_mode().mode
  pause(300)
  seen.ghost_after_accept = ghost(bufnr)
  vim.api.nvim_feedkeys(vim.keycode('<Esc>'), 'nt', false)
  pause(200)
end)

vim.schedule(step)
