"""The page at ``/``: talk to the served model from a browser, its reply streamed as it is written.

One self-contained HTML page (no external scripts or styles). With a chat template it keeps a
conversation and posts it to ``/v1/chat/completions``; without one it continues a prompt through
``/v1/completions``. Both ask with ``stream: true`` and read the server-sent events as they come.
"""

from __future__ import annotations

import html
import json

_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>__TITLE__</title>
<style>
body { font-family: system-ui, sans-serif; max-width: 46rem; margin: 2rem auto; padding: 0 1rem; color: #222; }
#messages { display: flex; flex-direction: column; gap: .5rem; margin-bottom: 1rem; }
.message { padding: .5rem .75rem; border-radius: .5rem; white-space: pre-wrap; }
.user { background: #e8f0fe; align-self: flex-end; }
.assistant { background: #f1f3f4; }
.error { background: #fdecea; color: #b3261e; }
form { display: flex; flex-direction: column; gap: .5rem; }
textarea { font: inherit; min-height: 4rem; }
.settings { display: flex; gap: 1rem; align-items: center; font-size: .9rem; }
.settings input { width: 5rem; }
</style></head>
<body data-mode="__MODE__" data-model="__MODEL__">
<h1>__TITLE__</h1>
<p>__HINT__ Up to __MAXLEN__ tokens of context.</p>
<div id="messages"></div>
<form id="ask">
  <textarea id="prompt" placeholder="__PLACEHOLDER__"></textarea>
  <div class="settings">
    <label>temperature <input id="temperature" type="number" min="0" max="2" step="0.1" value="0.7"></label>
    <label>max tokens <input id="max-tokens" type="number" min="1" value="64"></label>
    <button id="send" type="submit">Send</button>
    <button id="clear" type="button">Clear</button>
  </div>
</form>
<script>
const chat = document.body.dataset.mode === "chat";
const model = JSON.parse(document.body.dataset.model);
const history = [];
const messages = document.getElementById("messages");

function bubble(role, text) {
  const div = document.createElement("div");
  div.className = "message " + role;
  div.textContent = text;
  messages.appendChild(div);
  return div;
}

async function ask(prompt) {
  const settings = {model: model, stream: true,
    temperature: Number(document.getElementById("temperature").value),
    max_tokens: Number(document.getElementById("max-tokens").value)};
  let url, payload;
  if (chat) {
    history.push({role: "user", content: prompt});
    url = "/v1/chat/completions";
    payload = Object.assign({messages: history}, settings);
  } else {
    url = "/v1/completions";
    payload = Object.assign({prompt: prompt}, settings);
  }
  bubble("user", prompt);
  const reply = bubble("assistant", "");
  let text = "";
  const response = await fetch(url, {method: "POST", headers: {"Content-Type": "application/json"}, body: JSON.stringify(payload)});
  if (!response.ok) {
    const body = await response.json();
    reply.className = "message error";
    reply.textContent = body.error ? body.error.message : response.statusText;
    reply.dataset.done = "error";
    if (chat) history.pop();
    return;
  }
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const {done, value} = await reader.read();
    if (done) break;
    buffer += decoder.decode(value, {stream: true});
    let end;
    while ((end = buffer.indexOf("\\n\\n")) >= 0) {
      const line = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      if (!line.startsWith("data: ")) continue;
      const data = line.slice(6);
      if (data === "[DONE]") continue;
      const chunk = JSON.parse(data);
      if (chunk.error) { reply.className = "message error"; reply.textContent = chunk.error.message; continue; }
      for (const choice of chunk.choices) {
        text += chat ? (choice.delta.content || "") : (choice.text || "");
        if (choice.finish_reason) reply.dataset.finish = choice.finish_reason;
      }
      reply.textContent = text;
    }
  }
  if (chat) history.push({role: "assistant", content: text});
  reply.dataset.done = "true";
}

document.getElementById("ask").addEventListener("submit", (event) => {
  event.preventDefault();
  const box = document.getElementById("prompt");
  const prompt = box.value;
  if (!prompt.trim()) return;
  box.value = "";
  ask(prompt);
});
document.getElementById("clear").addEventListener("click", () => { history.length = 0; messages.textContent = ""; });
</script>
</body></html>
"""


def chat_page(model_name: str, *, chat: bool, max_len: int) -> str:
    hint = ("Messages go to /v1/chat/completions with the model's chat template." if chat else
            "This model has no chat template: what you write is continued through /v1/completions.")
    fields = {
        "__TITLE__": html.escape(model_name), "__MODE__": "chat" if chat else "completion",
        "__MODEL__": html.escape(json.dumps(model_name)), "__HINT__": hint, "__MAXLEN__": str(max_len),
        "__PLACEHOLDER__": "Your message" if chat else "Text to continue",
    }
    page = _PAGE
    for key, value in fields.items():
        page = page.replace(key, value)
    return page


__all__ = ["chat_page"]
