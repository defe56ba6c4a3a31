// "Try it": the decision from POST /api/route, then the answer streamed from POST /v1/chat/completions.
// Both calls carry the console session (cookie) and its CSRF token; every text from the server is put in
// with textContent, never as HTML.
(function () {
  "use strict";
  const csrf = document.querySelector('meta[name="csrf-token"]').content;
  const $ = (id) => document.getElementById(id);

  function post(path, body) {
    return fetch(path, {
      method: "POST", credentials: "same-origin", body: JSON.stringify(body),
      headers: {"Content-Type": "application/json", "X-CSRF-Token": csrf},
    });
  }

  async function errorText(response) {
    try { return (await response.json()).error.message; } catch (e) { return response.status + " " + response.statusText; }
  }

  function cell(row, text, cls) {
    const td = row.insertCell();
    td.textContent = text;
    if (cls) td.className = cls;
  }

  function showDecision(result) {
    const d = result.decision || {};
    $("try-chosen").textContent = d.chosen || result.models[0];
    $("try-plan").textContent = "(" + result.type + "; plan: " + result.models.join(" → ") + ")";
    const table = $("try-scores"), body = table.tBodies[0];
    body.replaceChildren();
    const scores = d.scores || {}, costs = d.expected_cost_usd || {};
    const names = Object.keys(scores).length ? Object.keys(scores) : result.models;
    for (const name of names) {
      const row = body.insertRow();
      cell(row, name);
      cell(row, name in scores ? scores[name].toFixed(4) : "–", "num");
      cell(row, name in costs ? costs[name].toPrecision(3) : "–", "num");
      cell(row, name === (d.chosen || result.models[0]) ? "chosen" : "");
    }
    table.hidden = false;
  }

  async function streamAnswer(response) {
    const reader = response.body.getReader(), decoder = new TextDecoder();
    let buffer = "", usage = null;
    for (;;) {
      const {value, done} = await reader.read();
      if (done) break;
      buffer += decoder.decode(value, {stream: true});
      let end;
      while ((end = buffer.indexOf("\n\n")) >= 0) {
        const frame = buffer.slice(0, end);
        buffer = buffer.slice(end + 2);
        for (const line of frame.split("\n")) {
          if (!line.startsWith("data: ") || line === "data: [DONE]") continue;
          const chunk = JSON.parse(line.slice(6));
          if (chunk.error) throw new Error(chunk.error.message);
          if (chunk.usage) usage = chunk.usage;
          for (const choice of chunk.choices || []) {
            if (choice.delta && choice.delta.content) $("try-answer").textContent += choice.delta.content;
          }
        }
      }
    }
    return usage;
  }

  // The request-log row (GET /api/requests/{id}) is written just after the answer ends: poll it briefly.
  async function loggedRow(requestId) {
    for (let attempt = 0; attempt < 30; attempt++) {
      const response = await fetch("/api/requests/" + encodeURIComponent(requestId), {credentials: "same-origin"});
      if (response.ok) return response.json();
      await new Promise((resolve) => setTimeout(resolve, 100));
    }
    return null;
  }

  $("try-form").addEventListener("submit", async (event) => {
    event.preventDefault();
    const model = $("try-policy").value;
    const messages = [{role: "user", content: $("try-prompt").value}];
    const maxTokens = parseInt($("try-max-tokens").value, 10) || 64;
    $("try-run").disabled = true;
    $("try-answer").textContent = "";
    $("try-usage").textContent = "";
    $("try-status").textContent = "Routing…";
    try {
      const routed = await post("/api/route", {model, messages});
      if (!routed.ok) throw new Error(await errorText(routed));
      showDecision(await routed.json());
      $("try-status").textContent = "Generating…";
      const answer = await post("/v1/chat/completions", {model, messages, max_tokens: maxTokens, stream: true,
                                                         stream_options: {include_usage: true}});
      if (!answer.ok) throw new Error(await errorText(answer));
      const answeredBy = answer.headers.get("x-link-model");
      if (answeredBy) $("try-chosen").textContent = answeredBy;
      const usage = await streamAnswer(answer);
      const requestId = answer.headers.get("x-link-request-id");
      let line = usage ? usage.prompt_tokens + " prompt + " + usage.completion_tokens + " completion tokens" : "";
      const row = await loggedRow(requestId);
      if (row) {
        line += " · $" + row.cost_usd.toFixed(6) + (row.latency_ms !== null ? " · " + Math.round(row.latency_ms) + " ms" : "");
      }
      $("try-usage").textContent = line;
      $("try-status").textContent = "Done (request " + requestId + ").";
    } catch (error) {
      $("try-status").textContent = "Error: " + error.message;
    } finally {
      $("try-run").disabled = false;
    }
  });
})();
