-- Ghost text on Neovim 0.10 / 0.11 against an in-process fake language server whose replies the
-- scenario writes itself (tests/lsp/test_nvim_client.py): what the real server never sends (an
-- item whose range starts before the cursor or replaces text after it, several lines, a reply to
-- a request already cancelled) and exact utf-16 positions around multibyte characters.
--   CODESPEC_NVIM_TEST='{"repo", "out", "file"}' nvim --headless --clean -S nvim_fake_driver.lua
local H = dofile(vim.json.decode(vim.env.CODESPEC_NVIM_TEST).repo .. '/tests/lsp/nvim_harness.lua')
local config = H.config

-- The fake server: utf-16 positions, inline completion; each inline completion request stays
-- pending until the scenario answers it.
local pending, inline = {}, {}
local fake_cmd, server = H.fake_server({
  positionEncoding = 'utf-16',
  textDocumentSync = { openClose = true, change = 1 },
  inlineCompletionProvider = true,
}, function(method, params, id, answer)
  if method ~= 'textDocument/inlineCompletion' then
    return false
  end
  local request = { id = id, params = params, answer = answer }
  inline[#inline + 1] = request
  pending[id] = request
  return true
end)
server.pending, server.inline = pending, inline

-- Wait for the next inline completion request (after `after` of them) and answer it.
local function next_request(after)
  return H.wait_for('inline completion request #' .. (after + 1), function()
    return server.inline[after + 1]
  end, 10000)
end

local function answer(request, items)
  server.pending[request.id] = nil
  request.answer(nil, { items = items })
end

local function utf16(text)
  return vim.str_utfindex(text, 'utf-16')
end

H.run(function(seen)
  local codespec = require('codespec')
  codespec.setup({ cmd = fake_cmd, debounce_ms = 20 })
  vim.cmd.edit(config.file)
  local bufnr = vim.api.nvim_get_current_buf()
  local client = H.attach(bufnr)
  seen.offset_encoding = client.offset_encoding
  vim.bo[bufnr].indentexpr = '' -- autoindent alone: a new line copies the indentation
  vim.bo[bufnr].autoindent = true
  local accepted = { command = 'codespec.accepted', title = 'accepted', arguments = { 'fake', 1 } }

  -- 1. An item whose range starts before the cursor (it re-types "pre", after multibyte
  --    characters on the line), three lines long.
  H.keys('2GA')
  local request = next_request(0)
  local line = H.line(bufnr, 2)
  local start = utf16(line) - 3
  seen.range = { line = line, position = request.params.position, expected_character = utf16(line) }
  answer(request, { {
    insertText = 'prefix_ü = 1\n    y = 2\n    z = 3',
    range = { start = { line = 1, character = start }, ['end'] = request.params.position },
    command = accepted,
  } })
  H.wait_for('the ghost text', function() return H.ghosts(bufnr)[1] end)
  seen.range.ghosts = H.ghosts(bufnr)
  seen.range.cursor = H.cursor()

  -- 2. Typing along it, across a line break (autoindent types the next line's indentation).
  H.type('fix_ü = 1\n')
  H.wait_for('the typed line break', function() return vim.api.nvim_buf_line_count(bufnr) == 4 end)
  seen.along = { ghosts = H.ghosts(bufnr), cursor = H.cursor(), requests = #server.inline,
    status = codespec.status(bufnr) }

  -- 3. <Tab> inserts the rest (the whole item over its range) and runs the item's command.
  H.keys('<Tab>')
  H.wait_for('the accepted item', function() return vim.api.nvim_buf_line_count(bufnr) == 5 end)
  seen.accepted = { lines = vim.api.nvim_buf_get_lines(bufnr, 0, -1, true), cursor = H.cursor(),
    ghosts = H.ghosts(bufnr) }
  H.wait_for('the command', function() return server.commands[1] end)
  seen.commands = vim.deepcopy(server.commands)

  -- 4. The request after the acceptance is typed over while pending: it is cancelled, and the
  --    answer the server sends anyway is not shown.
  local count = #server.inline
  local stale = next_request(count)
  H.type('q')
  H.wait_for('the cancellation', function() return vim.tbl_contains(server.cancels, stale.id) end)
  answer(stale, { { insertText = 'STALE', range = { start = stale.params.position, ['end'] = stale.params.position } } })
  H.wait_for('the stale answer to reach the client', function() return server.delivered[stale.id] end)
  seen.stale_delivered = { ghosts = H.ghosts(bufnr), status = codespec.status(bufnr) }
  local fresh = next_request(count + 1)
  seen.stale = { id = stale.id, cancels = vim.deepcopy(server.cancels), ghosts = H.ghosts(bufnr),
    stale_position = stale.params.position, fresh_position = fresh.params.position }
  answer(fresh, {})
  H.wait_for('the empty answer', function() return not codespec.status(bufnr).requesting end)
  seen.stale.status = codespec.status(bufnr)

  -- 5. An item whose range covers text after the cursor: drawn over it, then replacing it.
  --    Moving the cursor drops it and asks again where the cursor went.
  H.keys('<Esc>5G0fxi')
  count = #server.inline
  request = next_request(count)
  local replace = {
    insertText = 'value + 1',
    range = { start = request.params.position,
      ['end'] = { line = 4, character = request.params.position.character + 1 } },
    command = accepted,
  }
  answer(request, { replace })
  H.wait_for('the replacing ghost text', function() return H.ghosts(bufnr)[1] end)
  seen.replace = { line = H.line(bufnr, 5), cursor = H.cursor(), ghosts = H.ghosts(bufnr) }
  H.keys('<Left>')
  local moved = next_request(count + 1)
  seen.replace.moved = { ghosts = H.ghosts(bufnr), position = moved.params.position, first = request.params.position }
  answer(moved, {})
  H.keys('<Right>')
  request = next_request(count + 2)
  replace.range = { start = request.params.position,
    ['end'] = { line = 4, character = request.params.position.character + 1 } }
  answer(request, { replace })
  H.wait_for('the replacing ghost text again', function() return H.ghosts(bufnr)[1] end)
  H.keys('<Tab>')
  H.wait_for('the replacement', function() return H.line(bufnr, 5) ~= seen.replace.line end)
  seen.replace.after = { line = H.line(bufnr, 5), cursor = H.cursor() }
  H.wait_for('the second command', function() return server.commands[2] end)
  seen.commands = vim.deepcopy(server.commands)
  H.keys('<Esc>')
  H.wait_for('normal mode', function() return H.mode() == 'n' end)
end)
