// superggml's page: a chat over the server's own API and a live view of the pager (GET /v1/events).
"use strict";

const $ = (id) => document.getElementById(id);
const keyInput = $("key");
keyInput.value = localStorage.getItem("superggml-key") || "";
keyInput.addEventListener("change", () => localStorage.setItem("superggml-key", keyInput.value));

function headers() {
  const h = { "Content-Type": "application/json" };
  if (keyInput.value) h.Authorization = "Bearer " + keyInput.value;
  return h;
}

// Calls `onData` with each `data:` payload of a server-sent events response.
async function readEvents(response, onData) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += decoder.decode(value, { stream: true });
    let cut;
    while ((cut = buffer.indexOf("\n\n")) >= 0) {
      const event = buffer.slice(0, cut);
      buffer = buffer.slice(cut + 2);
      for (const line of event.split("\n")) {
        if (line.startsWith("data: ")) onData(line.slice(6));
      }
    }
  }
}

// -- chat -------------------------------------------------------------------------
const history = [];

function bubble(role, text) {
  const div = document.createElement("div");
  div.className = "msg " + role;
  div.textContent = text;
  $("messages").appendChild(div);
  return div;
}

$("ask").addEventListener("submit", async (e) => {
  e.preventDefault();
  const text = $("prompt").value.trim();
  if (!text) return;
  $("prompt").value = "";
  history.push({ role: "user", content: text });
  bubble("user", text);
  const out = bubble("assistant", "");
  out.dataset.state = "streaming";
  $("send").disabled = true;
  try {
    const r = await fetch("/v1/chat/completions", {
      method: "POST", headers: headers(),
      body: JSON.stringify({ messages: history, stream: true, max_tokens: 256 }),
    });
    if (!r.ok) {
      const err = await r.json().catch(() => ({}));
      throw new Error((err.error && err.error.message) || r.statusText);
    }
    await readEvents(r, (data) => {
      if (data === "[DONE]") return;
      const chunk = JSON.parse(data);
      if (chunk.error) throw new Error(chunk.error.message);
      const delta = chunk.choices[0].delta;
      if (delta && delta.content) out.textContent += delta.content;
    });
    history.push({ role: "assistant", content: out.textContent });
    out.dataset.state = "done";
  } catch (err) {
    out.className = "msg error";
    out.textContent = String(err.message || err);
    out.dataset.state = "error";
  } finally {
    $("send").disabled = false;
  }
});

// -- live view ----------------------------------------------------------------------
function size(bytes) {
  return bytes >= 2 ** 30 ? (bytes / 2 ** 30).toFixed(2) + " GiB" : (bytes / 2 ** 20).toFixed(0) + " MiB";
}

function show(s) {
  const row = $("blocks");
  while (row.children.length < s.blocks.length) {
    const b = document.createElement("span");
    b.title = "block " + row.children.length;
    row.appendChild(b);
  }
  s.blocks.forEach((place, i) => {
    const b = row.children[i];
    b.className = "block " + place;
    b.title = "block " + i + ": " + place;
  });
  row.dataset.updates = String(Number(row.dataset.updates) + 1);
  $("tps").textContent = s.tokens_per_s.toFixed(2);
  $("gbps").textContent = s.read_gb_s.toFixed(3) + " GB/s";
  $("hit").textContent = s.expert_hit_rate === null ? "no experts" : (100 * s.expert_hit_rate).toFixed(1) + "%";
  $("kv").textContent = `device ${s.kv_pages.device} · host ${s.kv_pages.host} · disk ${s.kv_pages.disk}`;
  $("mem").textContent = size(s.memory_used) + " of " + size(s.memory_total) +
    (s.budget ? " · budget " + size(s.budget) : "");
  $("reqs").textContent = `${s.requests_processing} running · ${s.requests_deferred} waiting`;
}

async function live() {
  for (;;) {
    try {
      const r = await fetch("/v1/events", { headers: headers() });
      if (r.ok) await readEvents(r, (data) => show(JSON.parse(data)));
    } catch (err) {
      // the server went away or restarted: try again
    }
    await new Promise((ok) => setTimeout(ok, 500));
  }
}

fetch("/v1/models", { headers: headers() })
  .then((r) => (r.ok ? r.json() : null))
  .then((m) => { $("model").textContent = m ? m.data[0].id : "(an API key is needed)"; })
  .catch(() => {});
live();
