-- Ghost text on Neovim 0.10 / 0.11 (editors/nvim/codespec.lua without vim.lsp.inline_completion)
-- against a real `codespec serve` on the shipped default model, typed as a user would
-- (tests/lsp/test_nvim_client.py). Records what the buffer, its extmarks and the server showed.
--   CODESPEC_NVIM_TEST='{"repo", "out", "python", "file", "encoding"}' nvim --headless --clean -S nvim_ghost_driver.lua
local H = dofile(vim.json.decode(vim.env.CODESPEC_NVIM_TEST).repo .. '/tests/lsp/nvim_harness.lua')
local config = H.config

local function copy(value)
  return vim.deepcopy(value)
end

H.run(function(seen)
  local codespec = require('codespec')
  codespec.setup({
    cmd = { config.python, '-m', 'codespec.commands.cli', 'serve' },
    init_options = { mode = 'auto', limits = { lineTokens = 16, blockTokens = 48 } },
    -- The server takes the client's first position encoding: Neovim lists utf-8 first.
    capabilities = config.encoding and { general = { positionEncodings = { config.encoding } } },
  })
  vim.cmd.edit(config.file)
  local bufnr = vim.api.nvim_get_current_buf()
  local client = H.attach(bufnr)
  seen.offset_encoding = client.offset_encoding
  local log = H.spy(client)
  vim.bo[bufnr].expandtab, vim.bo[bufnr].softtabstop = false, 0 -- a plain <Tab> inserts "\t"

  local function last_reply()
    local entry = log.inline[#log.inline]
    return entry and entry.reply and entry
  end
  local function items(entry)
    local result = entry.reply.result or {}
    return result.items or result
  end
  local function snapshot(entry)
    return {
      cursor = H.cursor(),
      line = H.line(bufnr, H.cursor()[1]),
      ghosts = H.ghosts(bufnr),
      status = codespec.status(bufnr),
      request = entry and { id = entry.id, position = entry.params.position, cursor = entry.cursor } or nil,
      items = entry and entry.reply and items(entry) or nil,
      requests = #log.inline,
    }
  end

  -- 1. Insert mode at the end of a line with multibyte characters before the cursor: the
  --    InsertEnter request is answered and shown at the cursor.
  local row = config.row
  seen.line_before = H.line(bufnr, row)
  H.keys(row .. 'GA')
  local first = H.wait_for('the first inline completion reply', last_reply)
  seen.shown = snapshot(first)
  local text = assert(items(first)[1], 'the model suggested nothing at the end of line ' .. row).insertText

  -- 2. Typing the suggestion's first character keeps showing the rest, without a new request.
  local typed = text:sub(1, 1)
  H.type(typed)
  H.wait_for('the typed character', function() return H.line(bufnr, row) == seen.line_before .. typed end)
  seen.typed = snapshot(nil)

  -- 3. <Tab> accepts: the suggestion lands in the buffer, its command reaches the server. The
  --    request that follows the acceptance gets an "x" typed over it while it is in flight.
  local in_flight
  log.on_inline = function(entry)
    log.on_inline = nil
    in_flight = entry
    H.type('x')
  end
  H.keys('<Tab>')
  H.wait_for('the accepted suggestion', function() return H.line(bufnr, row) ~= seen.line_before .. typed end)
  seen.accepted = snapshot(nil)
  seen.accepted.lines = vim.api.nvim_buf_get_lines(bufnr, 0, -1, true)
  seen.commands = copy(log.commands)

  -- 4. The request typed over was cancelled; the one after the "x" is what is shown.
  H.wait_for('a request after the acceptance', function() return in_flight end)
  H.wait_for('the reply to the request after the "x"', function()
    local entry = last_reply()
    return entry and entry ~= in_flight and entry
  end)
  H.wait_for('the server to answer the cancelled request', function()
    return vim.tbl_contains(log.states[in_flight.id] or {}, 'complete')
  end)
  seen.cancel = {
    id = in_flight.id,
    cancels = copy(log.cancels),
    states = copy(log.states[in_flight.id]),
    handler_called = in_flight.reply ~= nil, -- not for a RequestCancelled answer
    cursor_at_request = in_flight.cursor,
  }
  seen.after_cancel = snapshot(last_reply())

  -- 5. Leaving insert mode clears the ghost text.
  H.keys('<Esc>')
  H.wait_for('normal mode', function() return H.mode() == 'n' end)
  seen.left = snapshot(nil)

  -- 6. A multi-line suggestion at the start of the first line (a block that ends with a newline,
  --    in front of code): the first line over the cursor line, the rest as virtual lines.
  H.keys('ggI')
  local block = H.wait_for('the block reply', function()
    local entry = last_reply()
    return entry and entry.params.position.line == 0 and entry
  end)
  seen.block = snapshot(block)
  assert(items(block)[1], 'the model suggested nothing at the start of line 1')

  -- 7. Leaving the buffer (a new window, insert mode kept) clears it too.
  H.keys('<Cmd>split | enew<CR>')
  H.wait_for('another buffer', function() return vim.api.nvim_get_current_buf() ~= bufnr end)
  seen.other_buffer = { ghosts = H.ghosts(bufnr), status = codespec.status(bufnr), mode = H.mode() }
  H.keys('<Cmd>close<CR>')
  H.wait_for('the buffer again', function() return vim.api.nvim_get_current_buf() == bufnr end)

  -- 8. Typing (a space, then backspace) asks again there; <Tab> accepts all of the block's lines.
  local before = #log.inline
  H.keys(' <BS>')
  H.wait_for('the block reply again', function()
    local entry = last_reply()
    return entry and #log.inline > before and entry.params.position.line == 0 and entry
  end)
  seen.block_again = snapshot(last_reply())
  H.keys('<Tab>')
  H.wait_for('the accepted block', function() return H.line(bufnr, 1) ~= seen.block.line end)
  seen.block_accepted = { cursor = H.cursor(), lines = vim.api.nvim_buf_get_lines(bufnr, 0, -1, true) }

  -- 9. With no suggestion shown (the request is still waiting for its debounce), <Tab> is a Tab.
  local count = vim.api.nvim_buf_line_count(bufnr)
  H.keys('<Esc>Go<Tab>')
  H.wait_for('the tab', function()
    return vim.api.nvim_buf_line_count(bufnr) > count and H.line(bufnr, count + 1):find('\t') ~= nil
  end)
  seen.tab = { line = H.line(bufnr, count + 1), status = codespec.status(bufnr), ghosts = H.ghosts(bufnr) }
  H.keys('<Esc>')
  H.wait_for('normal mode', function() return H.mode() == 'n' end)

  seen.commands = copy(log.commands)
  seen.history = H.request(client, 'codespec/stats', {}, bufnr).history
end)
