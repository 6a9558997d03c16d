// labswarm dashboard: what every page shares. No framework; the API is called on the login cookie.
"use strict";

const LS = (() => {
  const body = document.body.dataset;
  const api = body.api || "";
  const ui = body.ui || "";
  const csrfHeader = body.csrfHeader || "x-labswarm-ui";

  /** Show a line at the top of the page (an error unless ok). */
  function say(text, ok = false) {
    const box = document.getElementById("message");
    if (!box) return;
    box.textContent = text;
    box.classList.toggle("ok", ok);
    box.hidden = !text;
  }

  /** Call the manager's API on the login cookie; the JSON answer, or throws with the API's reason. */
  async function call(method, path, body) {
    const headers = { [csrfHeader]: "1", Accept: "application/json" };
    if (body !== undefined) headers["Content-Type"] = "application/json";
    const response = await fetch(api + path, {
      method, headers, credentials: "same-origin", body: body === undefined ? undefined : JSON.stringify(body),
    });
    if (response.status === 401) { // logged out: this page shows the login form
      window.location.reload();
      throw new Error("logged out");
    }
    const text = await response.text();
    const data = text ? JSON.parse(text) : null;
    if (!response.ok) {
      let detail = data && data.detail;
      if (Array.isArray(detail)) detail = detail.map((d) => (d.path ? d.path + ": " : "") + d.reason).join("; ");
      throw new Error(`${method} ${path}: ${response.status} ${detail || response.statusText}`);
    }
    return data;
  }

  /** A number for people: n digits after the point, "–" for none. */
  function num(value, digits = 1) {
    return value === null || value === undefined || Number.isNaN(value) ? "–" : Number(value).toFixed(digits);
  }

  function setText(id, text) {
    const el = document.getElementById(id);
    if (el) el.textContent = text;
  }

  /** A uPlot chart filling its container's width. */
  function chart(container, options, data) {
    const width = () => Math.max(300, container.clientWidth - 8);
    const plot = new uPlot({ width: width(), height: 220, ...options }, data, container);
    window.addEventListener("resize", () => plot.setSize({ width: width(), height: 220 }));
    return plot;
  }

  /** Text of a table cell. */
  function cell(row, text, cls) {
    const td = row.insertCell();
    td.textContent = text === null || text === undefined ? "" : String(text);
    if (cls) td.className = cls;
    return td;
  }

  return { api, ui, call, say, num, setText, chart, cell };
})();
