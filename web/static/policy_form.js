// The policy form: the hint under the options names the option keys of the type selected (the server writes
// each type's keys into #option-hints; web/pages/policies.py option_hints).
document.addEventListener("DOMContentLoaded", function () {
  "use strict";
  const select = document.getElementById("type"), data = document.getElementById("option-hints");
  if (!select || !data) return;
  const hints = JSON.parse(data.textContent);
  select.addEventListener("change", function () {
    document.getElementById("options-type").textContent = select.value;
    document.getElementById("options-keys").textContent = hints[select.value] || "any keys (checked when saved)";
  });
});
