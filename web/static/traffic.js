// The Traffic page's charts (Chart.js), drawn from the /api/traffic result embedded as JSON in the page.
(function () {
  "use strict";
  const stats = JSON.parse(document.getElementById("traffic-data").textContent);
  const labels = stats.series.map((b) => {
    const t = new Date(b.start);
    return t.toISOString().slice(stats.bucket_s >= 86400 ? 5 : 11, stats.bucket_s >= 86400 ? 10 : 16);
  });
  const color = ["#2563eb", "#dc2626", "#16a34a", "#9333ea"];

  function chart(id, type, datasets) {
    new Chart(document.getElementById(id), {
      type,
      data: {labels, datasets: datasets.map((d, i) => ({borderColor: color[i], backgroundColor: color[i] + "99",
                                                         borderWidth: 2, pointRadius: 2, tension: 0.2, ...d}))},
      options: {responsive: true, maintainAspectRatio: false, animation: false,
                plugins: {legend: {display: datasets.length > 1, position: "bottom", labels: {boxWidth: 12}}},
                scales: {x: {ticks: {maxTicksLimit: 8, maxRotation: 0}}, y: {beginAtZero: true}}},
    });
  }

  const col = (name) => stats.series.map((b) => b[name]);
  chart("chart-requests", "bar", [{label: "requests", data: col("requests")}, {label: "errors", data: col("errors")}]);
  chart("chart-tokens", "line", [{label: "prompt", data: col("prompt_tokens")},
                                 {label: "completion", data: col("completion_tokens")}]);
  chart("chart-cost", "line", [{label: "USD", data: col("cost_usd")}]);
  chart("chart-latency", "line", [{label: "p50", data: col("latency_p50_ms")}, {label: "p95", data: col("latency_p95_ms")}]);
})();
