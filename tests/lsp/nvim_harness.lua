-- Shared by the ghost-text drivers (nvim_ghost_driver.lua, nvim_fake_driver.lua): a scenario runs
-- as a coroutine inside Neovim's main loop, so keys fed with nvim_feedkeys are processed as if
-- typed (insert mode, autocommands, mappings) between its steps. Every wait ends on a condition;
-- the deadlines only guard against hangs. What the scenario records is written as JSON.
--   CODESPEC_NVIM_TEST='{"repo": ..., "out": ..., ...}' nvim --headless --clean -S DRIVER
local H = {}

H.config = vim.json.decode((assert(vim.env.CODESPEC_NVIM_TEST, 'CODESPEC_NVIM_TEST is not set')),
  { luanil = { object = true, array = true } })
package.path = H.config.repo .. '/editors/nvim/?.lua;' .. package.path
H.seen = { nvim = tostring(vim.version()), has_inline_completion = vim.lsp.inline_completion ~= nil }

local co

local function finish(failure)
  if failure then
    H.seen.failure = failure
  end
  H.seen.errmsg = vim.v.errmsg
  local handle = assert(io.open(H.config.out, 'w'))
  handle:write(vim.json.encode(H.seen))
  handle:close()
  for _, client in ipairs(vim.lsp.get_clients()) do
    client:stop()
  end
  vim.wait(5000, function() return #vim.lsp.get_clients() == 0 end, 10)
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

function H.run(scenario)
  co = coroutine.create(function()
    scenario(H.seen)
  end)
  vim.schedule(step)
end

-- Yield to the main loop (keys, replies, timers run) until cond() returns a truthy value.
function H.wait_for(what, cond, ms)
  local deadline = vim.uv.hrtime() + (ms or 30000) * 1e6
  while true do
    local value = cond()
    if value then
      return value
    end
    if vim.uv.hrtime() > deadline then
      error('timed out waiting for ' .. what, 2)
    end
    vim.defer_fn(step, 5)
    coroutine.yield()
  end
end

-- Let the main loop handle what is pending (typed keys are handled only between the scenario's
-- steps, never inside vim.wait): for a step whose effect is that nothing happens.
function H.settle()
  local turns = 0
  H.wait_for('the main loop to settle', function()
    turns = turns + 1
    return turns > 5
  end)
end

-- Keys as typed; mappings apply (`<Tab>` is the accept key).
function H.keys(keys)
  vim.api.nvim_feedkeys(vim.keycode(keys), 'mt', false)
end

-- Literal text as typed, no mappings.
function H.type(text)
  vim.api.nvim_feedkeys(text, 'nt', false)
end

function H.request(client, method, params, bufnr)
  local reply
  client:request(method, params, function(err, result)
    reply = { err = err, result = result }
  end, bufnr)
  H.wait_for(method .. ' reply', function() return reply end, 60000)
  assert(not reply.err, method .. ': ' .. vim.inspect(reply.err))
  return reply.result
end

function H.attach(bufnr)
  local started = false
  return H.wait_for('codespec to attach', function()
    local client = vim.lsp.get_clients({ bufnr = bufnr, name = 'codespec' })[1]
    if started and not client then
      error('codespec quit before attaching (see the LSP log: ' .. vim.lsp.get_log_path() .. ')')
    end
    started = started or client ~= nil
    return client and client.initialized and client
  end, 60000)
end

-- Records what the module sends through the client: inline completion requests (with their
-- replies, as the module's handler gets them), $/cancelRequest ids, executed commands, and each
-- request's life as Neovim tracks it (states[id]: pending, cancel, complete = the server answered;
-- Neovim hands no handler a RequestCancelled answer).
function H.spy(client)
  local log = { inline = {}, cancels = {}, commands = {}, states = {} }
  vim.api.nvim_create_autocmd('LspRequest', {
    callback = function(args)
      if args.data.client_id == client.id then
        local states = log.states[args.data.request_id] or {}
        states[#states + 1] = args.data.request.type
        log.states[args.data.request_id] = states
      end
    end,
  })
  local request, cancel = client.request, client.cancel_request
  client.request = function(self, method, params, handler, bufnr)
    if method == 'textDocument/inlineCompletion' and handler then
      local entry = { params = params, cursor = vim.api.nvim_win_get_cursor(0) }
      log.inline[#log.inline + 1] = entry
      local ok, id = request(self, method, params, function(err, result, ctx)
        entry.reply = { err = err, result = result }
        return handler(err, result, ctx)
      end, bufnr)
      entry.id = id
      if log.on_inline then
        log.on_inline(entry)
      end
      return ok, id
    elseif method == 'workspace/executeCommand' then
      log.commands[#log.commands + 1] = params
    end
    return request(self, method, params, handler, bufnr)
  end
  client.cancel_request = function(self, id)
    log.cancels[#log.cancels + 1] = id
    return cancel(self, id)
  end
  return log
end

-- The ghost text extmarks of the buffer, as plain data.
function H.ghosts(bufnr)
  local ns = vim.api.nvim_get_namespaces().codespec_ghost
  local found = {}
  if not ns then
    return found
  end
  for _, mark in ipairs(vim.api.nvim_buf_get_extmarks(bufnr, ns, 0, -1, { details = true })) do
    local details = mark[4]
    local function text_of(chunks)
      local parts = {}
      for _, chunk in ipairs(chunks or {}) do
        parts[#parts + 1] = chunk[1]
      end
      return table.concat(parts)
    end
    local virt_lines = {}
    for _, line in ipairs(details.virt_lines or {}) do
      virt_lines[#virt_lines + 1] = text_of(line)
    end
    found[#found + 1] = {
      row = mark[2],
      col = mark[3],
      pos = details.virt_text_pos,
      virt_text = text_of(details.virt_text),
      hl = details.virt_text and details.virt_text[1] and details.virt_text[1][2] or nil,
      virt_lines = virt_lines,
    }
  end
  return found
end

function H.line(bufnr, row)
  return vim.api.nvim_buf_get_lines(bufnr, row - 1, row, true)[1]
end

function H.cursor()
  local cursor = vim.api.nvim_win_get_cursor(0)
  return { cursor[1], cursor[2] }
end

function H.mode()
  return vim.api.nvim_get_mode().mode
end

-- An in-process fake language server for vim.lsp (a `cmd` function): answers initialize with
-- `capabilities` (plus executeCommand for codespec.accepted) and every method `on_request`
-- does not take; `on_request(method, params, id, answer)` returns true when it took the request
-- (answering now or later with answer(err, result)). Records cancels, commands, notifications
-- and which replies reached the client in the returned `server` table.
function H.fake_server(capabilities, on_request)
  local server = { cancels = {}, commands = {}, notifications = {}, delivered = {}, opened = {} }
  local function cmd(dispatchers)
    local closing, last_id = false, 0
    local rpc = {}
    function rpc.request(method, params, callback, notify_reply_callback)
      last_id = last_id + 1
      local id = last_id
      local function answer(err, result)
        vim.schedule(function()
          callback(err, result)
          server.delivered[id] = true
          if notify_reply_callback then
            notify_reply_callback(id)
          end
        end)
      end
      if method == 'initialize' then
        answer(nil, { capabilities = vim.tbl_extend('force',
          { executeCommandProvider = { commands = { 'codespec.accepted' } } }, capabilities) })
      elseif on_request(method, params, id, answer) then
        -- taken by the scenario
      elseif method == 'workspace/executeCommand' then
        server.commands[#server.commands + 1] = params
        answer(nil, vim.NIL)
      else
        answer(nil, vim.NIL)
      end
      return true, id
    end
    function rpc.notify(method, params)
      if method == '$/cancelRequest' then
        server.cancels[#server.cancels + 1] = params.id
      elseif method == 'exit' then
        closing = true
        vim.schedule(function() dispatchers.on_exit(0, 0) end)
      else
        server.notifications[#server.notifications + 1] = method
        if method == 'textDocument/didOpen' then
          server.opened[#server.opened + 1] = params.textDocument.uri
        end
      end
      return true
    end
    function rpc.is_closing()
      return closing
    end
    function rpc.terminate()
      closing = true
    end
    return rpc
  end
  return cmd, server
end

return H
