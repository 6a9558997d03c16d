// Overview: the tables are rendered by the server; they are fetched again every 2 s.
"use strict";
(() => {
  const box = document.getElementById("overview");
  const PERIOD_MS = 2000;
  async function refresh() {
    try {
      const response = await fetch(box.dataset.refresh, { credentials: "same-origin" });
      if (response.status === 401) { // logged out: this page shows the login form
        window.location.reload();
        return;
      }
      if (response.ok) {
        box.innerHTML = await response.text();
        LS.say("");
      }
    } catch (error) {
      LS.say("the manager does not answer: " + error.message);
    }
    setTimeout(refresh, PERIOD_MS);
  }
  setTimeout(refresh, PERIOD_MS);
})();
