// The Traffic page's charts (Chart.js), drawn from the /api/traffic result embedded as JSON in the page.
(function () {
  "use strict";
  const stats = JSON.parse(document.getElementById("traffic-data").textContent);
  // Bucket starts in UTC: "HH:MM" within a day, "MM-DD HH:MM" over several days.
  const isLong = stats.bucket_s * stats.series.length > 86400;
  const labels = stats.series.map((b) => new Date(b.start).toISOString().slice(isLong ? 5 : 11, 16).replace("T", " "));
  const color = ["#2563eb", "#dc2626", "#16a34a", "#9333ea"];

  function chart(id, type, datasets, yTick) {
    const y = {beginAtZero: true};
    if (yTick) y.ticks = {callback: yTick};
    new Chart(document.getElementById(id), {
      type,
      data: {labels, datasets: datasets.map((d, i) => ({borderColor: color[i], backgroundColor: color[i] + "99",
                                                         borderWidth: 2, pointRadius: 2, tension: 0.2, ...d}))},
      options: {responsive: true, maintainAspectRatio: false, animation: false,
                plugins: {legend: {display: datasets.length > 1, position: "bottom", labels: {boxWidth: 12}},
                          tooltip: yTick ? {callbacks: {label: (c) => c.dataset.label + ": " + yTick(c.parsed.y)}} : {}},
                scales: {x: {ticks: {maxTicksLimit: 8, maxRotation: 0}}, y}},
    });
  }

  const col = (name) => stats.series.map((b) => b[name]);
  chart("chart-requests", "bar", [{label: "requests", data: col("requests")}, {label: "errors", data: col("errors")}]);
  chart("chart-tokens", "line", [{label: "prompt", data: col("prompt_tokens")},
                                 {label: "completion", data: col("completion_tokens")}]);
  chart("chart-cost", "line", [{label: "USD", data: col("cost_usd")}], (value) => linkFormat.usd(value));
  chart("chart-latency", "line", [{label: "p50", data: col("latency_p50_ms")}, {label: "p95", data: col("latency_p95_ms")}]);
})();
