-- What codespec's Neovim modules share about Neovim's LSP client: 0.10 calls client methods with
-- `.` and 0.11 with `:`, LSP characters against byte columns, and the end of a buffer's attachment.
local C = {}

local has_011 = vim.fn.has('nvim-0.11') == 1
C.has_011 = has_011

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

C.call = call
C.client_for = client_for
C.lsp_character = lsp_character
C.byte_index = byte_index
C.execute_command = execute_command
C.on_detach = on_detach

return C
