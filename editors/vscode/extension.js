// codespec for VS Code: launches `codespec serve` (LSP over stdio) through vscode-languageclient.
// Inline completions (LSP 3.18 textDocument/inlineCompletion) are handled by the client library
// itself (on by default from vscode-languageclient 10.1); accepting one runs the server's
// `codespec.accepted` command, which the client proxies to workspace/executeCommand.
//
// Next edits (textDocument/copilotInlineEdit): after an edit, the change the server suggests at
// the next place it applies, shown as a diff decoration (the replaced text struck through, the
// new text after it) and applied with Tab (Esc dismisses). A suggestion is only shown and applied
// for the document version it was asked for. One in another file is announced in the status bar
// and Tab goes there: to the diff, in a document open at the version the server named, or, for a
// file the server read from disk (version null), opening it and asking there; Tab again applies.
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

// ---- next edits ---------------------------------------------------------------------------------
const removedStyle = vscode.window.createTextEditorDecorationType({
  backgroundColor: new vscode.ThemeColor('diffEditor.removedTextBackground'),
  textDecoration: 'line-through',
});
const addedStyle = vscode.window.createTextEditorDecorationType({
  after: { backgroundColor: new vscode.ThemeColor('diffEditor.insertedTextBackground'), margin: '0 0 0 1ch' },
});
let nextEdit = null; // { editor, version, edit: {range, text, command, textDocument}, status, elsewhere }
let nextEditAsk = 0; // the newest request; an older reply is dropped
let nextEditTimer = null;

function clearNextEdit() {
  nextEditAsk++; // a reply still on its way is for what was dismissed
  if (nextEdit) {
    if (!nextEdit.elsewhere) {
      nextEdit.editor.setDecorations(removedStyle, []);
      nextEdit.editor.setDecorations(addedStyle, []);
    }
    nextEdit.status.dispose();
  }
  nextEdit = null;
  vscode.commands.executeCommand('setContext', 'codespec.nextEditVisible', false);
}

async function suggestNextEdit() {
  const editor = vscode.window.activeTextEditor;
  if (!editor || !client) return;
  clearNextEdit();
  const ask = nextEditAsk;
  const document = editor.document;
  const version = document.version;
  const result = await client.sendRequest('textDocument/copilotInlineEdit', {
    textDocument: { uri: document.uri.toString(), version },
    position: client.code2ProtocolConverter.asPosition(editor.selection.active),
    otherDocuments: true, // an edit in another file is taken (goToNextEdit)
  });
  if (ask !== nextEditAsk) return; // superseded by a newer request
  const edit = result && result.edits && result.edits[0];
  const uri = edit && edit.textDocument && edit.textDocument.uri;
  if (edit && document.version === version && uri && uri !== document.uri.toString()) {
    // another document: announced here, Tab goes there (never applied to this one)
    const target = vscode.Uri.parse(uri);
    const where = `${vscode.workspace.asRelativePath(target)}:${edit.range.start.line + 1}`;
    const status = vscode.window.setStatusBarMessage(`codespec: next edit in ${where} (Tab goes there, Esc dismisses)`);
    nextEdit = { editor, version, edit, status, elsewhere: target };
    await vscode.commands.executeCommand('setContext', 'codespec.nextEditVisible', true);
    return;
  }
  if (!edit || document.version !== version || (edit.textDocument && edit.textDocument.version !== version)) {
    vscode.window.setStatusBarMessage('codespec: no next edit', 3000);
    return;
  }
  await showNextEdit(editor, version, edit);
}

async function showNextEdit(editor, version, edit) {
  const range = client.protocol2CodeConverter.asRange(edit.range);
  const shown = edit.text.split('\n').join(' ⏎ ');
  editor.setDecorations(removedStyle, range.isEmpty ? [] : [range]);
  editor.setDecorations(addedStyle, [{ range: new vscode.Range(range.end, range.end), renderOptions: { after: { contentText: shown } } }]);
  editor.revealRange(range, vscode.TextEditorRevealType.InCenterIfOutsideViewport);
  const status = vscode.window.setStatusBarMessage('codespec: next edit (Tab applies, Esc dismisses)');
  nextEdit = { editor, version, edit, range, status };
  await vscode.commands.executeCommand('setContext', 'codespec.nextEditVisible', true);
  client.sendNotification('textDocument/didShowInlineEdit', { item: { command: edit.command } });
}

// Go to a next edit in another document: one open at the version the server named shows its diff;
// a file the server read from disk (version null) is opened and asked about where the edit starts
// (the server has that answer ready). Anything else is stale.
async function goToNextEdit(target, edit) {
  const version = edit.textDocument.version;
  const open = vscode.workspace.textDocuments.find((document) => document.uri.toString() === target.toString());
  if (typeof version === 'number' && (!open || open.version !== version)) {
    vscode.window.setStatusBarMessage('codespec: the next edit is for another version of that file', 3000);
    return;
  }
  const document = open || (await vscode.workspace.openTextDocument(target));
  const editor = await vscode.window.showTextDocument(document);
  const start = client.protocol2CodeConverter.asPosition(edit.range.start);
  editor.selection = new vscode.Selection(start, start);
  if (typeof version === 'number') {
    await showNextEdit(editor, version, edit);
  } else {
    await suggestNextEdit(); // opened now (didOpen went first): ask there
  }
}

async function acceptNextEdit() {
  const shown = nextEdit;
  clearNextEdit();
  if (!shown || shown.editor.document.version !== shown.version) return; // stale: never applied
  if (shown.elsewhere) {
    await goToNextEdit(shown.elsewhere, shown.edit);
    return;
  }
  const document = shown.editor.document;
  const start = document.offsetAt(shown.range.start);
  // the editor's own edit: refused when the document changed in between
  if (!(await shown.editor.edit((builder) => builder.replace(shown.range, shown.edit.text)))) return;
  // the cursor goes to the end of the applied text, as Copilot's next edits do (the next
  // suggestion is asked from there, and was speculated from there)
  const end = document.positionAt(start + shown.edit.text.length);
  shown.editor.selection = new vscode.Selection(end, end);
  if (shown.edit.command) {
    await vscode.commands.executeCommand(shown.edit.command.command, ...(shown.edit.command.arguments || []));
  }
}

function onDocumentChange(event) {
  if (nextEdit && event.document === nextEdit.editor.document && event.contentChanges.length) {
    clearNextEdit(); // a shown suggestion is for the text before this change
  }
  const config = vscode.workspace.getConfiguration('codespec');
  const editor = vscode.window.activeTextEditor;
  if (!config.get('nextEdit.auto') || !editor || editor.document !== event.document || !event.contentChanges.length) return;
  clearTimeout(nextEditTimer);
  nextEditTimer = setTimeout(() => suggestNextEdit().catch(() => {}), config.get('nextEdit.debounceMs'));
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
    vscode.commands.registerCommand('codespec.nextEdit', () => suggestNextEdit().catch((error) =>
      vscode.window.showErrorMessage(`codespec: next edit failed: ${error.message || error}`))),
    vscode.commands.registerCommand('codespec.acceptNextEdit', acceptNextEdit),
    vscode.commands.registerCommand('codespec.rejectNextEdit', clearNextEdit),
    vscode.workspace.onDidChangeTextDocument(onDocumentChange),
    removedStyle,
    addedStyle,
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
