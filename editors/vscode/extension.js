// codespec for VS Code: launches `codespec serve` (LSP over stdio) through vscode-languageclient.
// Inline completions (LSP 3.18 textDocument/inlineCompletion) are handled by the client library
// itself (on by default from vscode-languageclient 10.1); accepting one runs the server's
// `codespec.accepted` command, which the client proxies to workspace/executeCommand.
'use strict';

const vscode = require('vscode');
const { LanguageClient, TransportKind } = require('vscode-languageclient/node');

let client;

function initializationOptions(config) {
  return {
    model: config.get('model') || null,
    draft: config.get('draft') || null,
    device: config.get('device'),
    promptFormat: config.get('promptFormat'),
    proposer: config.get('proposer'),
    mode: config.get('mode'),
    completionFallback: false, // VS Code shows inline items; a duplicate completion item is noise
    limits: { lineTokens: config.get('lineTokens'), blockTokens: config.get('blockTokens') },
    index: {
      enabled: config.get('index.enabled'),
      exclude: config.get('index.exclude'),
      maxTokens: config.get('index.maxTokens'),
    },
  };
}

function createClient() {
  const config = vscode.workspace.getConfiguration('codespec');
  const executable = { command: config.get('command'), args: ['serve'], transport: TransportKind.stdio };
  return new LanguageClient('codespec', 'codespec', { run: executable, debug: executable }, {
    documentSelector: [{ scheme: 'file' }, { scheme: 'untitled' }],
    initializationOptions: initializationOptions(config),
  });
}

// Rewrite the selection with an optional instruction; the result streams in as
// codespec/editDelta notifications (shown in the status bar) and is applied at the end.
async function rewriteSelection() {
  const editor = vscode.window.activeTextEditor;
  if (!editor || !client) return;
  const selection = editor.selection;
  if (selection.isEmpty) {
    vscode.window.showInformationMessage('codespec: select the code to rewrite first');
    return;
  }
  const instruction = await vscode.window.showInputBox({ prompt: 'Instruction (empty: clean up)', value: '' });
  if (instruction === undefined) return;
  const editId = `vscode-${Date.now()}`;
  let received = 0;
  const status = vscode.window.setStatusBarMessage('codespec: rewriting…');
  const listener = client.onNotification('codespec/editDelta', (params) => {
    if (params.editId === editId) {
      received += params.text.length;
      vscode.window.setStatusBarMessage(`codespec: rewriting… ${received} characters`, 2000);
    }
  });
  try {
    const result = await client.sendRequest('codespec/edit', {
      textDocument: { uri: editor.document.uri.toString() },
      range: client.code2ProtocolConverter.asRange(selection),
      instruction: instruction || undefined,
      editId,
    });
    const edit = new vscode.WorkspaceEdit();
    for (const change of result.edits) {
      edit.replace(editor.document.uri, client.protocol2CodeConverter.asRange(change.range), change.newText);
    }
    await vscode.workspace.applyEdit(edit);
    const usage = result.usage;
    vscode.window.setStatusBarMessage(
      `codespec: ${usage.completion_tokens} tokens, ${usage.accepted_prediction_tokens} copied from the original`, 5000);
  } catch (error) {
    vscode.window.showErrorMessage(`codespec: rewrite failed: ${error.message || error}`);
  } finally {
    listener.dispose();
    status.dispose();
  }
}

async function showStats() {
  if (!client) return;
  const stats = await client.sendRequest('codespec/stats', {});
  const document = await vscode.workspace.openTextDocument({ language: 'json', content: JSON.stringify(stats, null, 2) });
  await vscode.window.showTextDocument(document, { preview: true });
}

async function activate(context) {
  client = createClient();
  context.subscriptions.push(
    vscode.commands.registerCommand('codespec.rewriteSelection', rewriteSelection),
    vscode.commands.registerCommand('codespec.showStats', showStats),
    vscode.commands.registerCommand('codespec.restart', async () => {
      if (client) await client.stop();
      client = createClient();
      await client.start();
    }),
  );
  await client.start();
}

function deactivate() {
  return client ? client.stop() : undefined;
}

module.exports = { activate, deactivate };
