// The console's number formats in the browser, the same rule as web/formatting.py (format_usd): USD with two
// decimals from one dollar up; below, four significant digits in fixed point without trailing zeros; under a
// nano-dollar, scientific. Used by "try it" and the Traffic charts' cost axis.
window.linkFormat = (function () {
  "use strict";
  const SIGNIFICANT_DIGITS = 4;

  function usd(value) {
    if (value === null || value === undefined || !Number.isFinite(value)) return "–";
    if (value === 0) return "$0";
    const sign = value < 0 ? "-" : "", amount = Math.abs(value);
    if (amount >= 1 - 0.5 * Math.pow(10, -SIGNIFICANT_DIGITS)) {
      return sign + "$" + amount.toLocaleString("en-US", {minimumFractionDigits: 2, maximumFractionDigits: 2});
    }
    if (amount >= 1e-9) {
      const decimals = SIGNIFICANT_DIGITS - 1 - Math.floor(Math.log10(amount));
      return sign + "$" + amount.toFixed(decimals).replace(/0+$/, "").replace(/\.$/, "");
    }
    return sign + "$" + amount.toExponential(SIGNIFICANT_DIGITS - 1);
  }

  return {usd};
})();
