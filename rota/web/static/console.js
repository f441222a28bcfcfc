// The console's only script of its own (the Content-Security-Policy allows no
// inline script): confirmation before a form marked data-confirm is sent.
"use strict";
document.addEventListener("submit", (event) => {
  const message = event.target.dataset && event.target.dataset.confirm;
  if (message && !window.confirm(message)) {
    event.preventDefault();
  }
});
