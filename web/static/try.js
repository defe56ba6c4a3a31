// "Try it": the decision from POST /api/route, then the answer streamed from POST /v1/chat/completions.
// Both calls carry the console session (cookie) and its CSRF token; every text from the server is put in
// with textContent, never as HTML.
(function () {
  "use strict";
  const csrf = document.querySelector('meta[name="csrf-token"]').content;
  const $ = (id) => document.getElementById(id);
  // Policies that predict nothing before the call: what they do instead.
  const NO_PREDICTION = {
    fixed: "it always sends the request to its one model",
    fallback: "its models are tried in order, the next only when one fails before answering",
    moa: "every proposer answers, then the aggregator writes the answer",
    cascade: "the cheapest model answers first; a low score escalates to the next",
  };

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
    const table = $("try-scores"), body = table.tBodies[0], note = $("try-note");
    body.replaceChildren();
    const scores = d.scores || {}, costs = d.expected_cost_usd || {};
    if (!Object.keys(scores).length) {
      table.hidden = true;
      note.textContent = result.type + " policy: no prediction; " + (NO_PREDICTION[result.type] || "it scores no model") + ".";
      note.hidden = false;
      return;
    }
    for (const name of Object.keys(scores)) {
      const row = body.insertRow();
      cell(row, name);
      cell(row, scores[name].toFixed(4), "num");
      cell(row, name in costs ? linkFormat.usd(costs[name]) : "–", "num");
      cell(row, name === d.chosen ? "chosen" : "");
    }
    note.hidden = true;
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
    const temperature = parseFloat($("try-temperature").value);
    $("try-run").disabled = true;
    $("try-answer").textContent = "";
    $("try-usage").textContent = "";
    $("try-status").textContent = "Routing…";
    try {
      const sampling = Number.isFinite(temperature) ? {temperature} : {temperature: 0};
      const routed = await post("/api/route", {model, messages, ...sampling});
      if (!routed.ok) throw new Error(await errorText(routed));
      showDecision(await routed.json());
      $("try-status").textContent = "Generating…";
      const answer = await post("/v1/chat/completions", {model, messages, max_tokens: maxTokens, stream: true,
                                                         stream_options: {include_usage: true}, ...sampling});
      if (!answer.ok) throw new Error(await errorText(answer));
      const answeredBy = answer.headers.get("x-link-model");
      if (answeredBy) $("try-chosen").textContent = answeredBy;
      const usage = await streamAnswer(answer);
      const requestId = answer.headers.get("x-link-request-id");
      let line = usage ? usage.prompt_tokens + " prompt + " + usage.completion_tokens + " completion tokens" : "";
      const billed = usage && usage.link_billed;  // a cascade or MoA: its answer's own call above, every call here
      if (billed) {
        line += " (billed over " + billed.calls + " calls: " + billed.prompt_tokens + " + " + billed.completion_tokens + ")";
      }
      const row = await loggedRow(requestId);
      if (row) {
        line += " · " + linkFormat.usd(row.cost_usd) + (row.latency_ms !== null ? " · " + Math.round(row.latency_ms) + " ms" : "");
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
