// Small helpers for the dashboard's forms (no inline scripts: the Content-Security-Policy
// allows scripts from the hub only).
//
// - The rent form (data-template-fills="<id of a json_script>"): choosing a template writes
//   its image, ports, environment, command and warm-up into the fields, so the renter sees
//   what will run and can change it; choosing "Custom image" clears what was filled and left
//   untouched.
// - Any form with data-confirm="question" asks before it is sent (Stop a rental).
(function () {
  "use strict";
  var FIELDS = ["image", "ports", "env", "command", "warmup"];

  function setUpRentForm(form) {
    var source = document.getElementById(form.getAttribute("data-template-fills"));
    var select = form.querySelector("select[name=template]");
    if (!source || !select) return;
    var fills = JSON.parse(source.textContent);
    var filled = {};
    function fill() {
      var chosen = fills[select.value] || null;
      FIELDS.forEach(function (name) {
        var field = form.querySelector("[name=" + name + "]");
        if (!field) return;
        if (chosen) {
          field.value = chosen[name] || "";
          filled[name] = field.value;
        } else if (filled[name] !== undefined && field.value === filled[name]) {
          field.value = "";
          delete filled[name];
        }
      });
    }
    select.addEventListener("change", fill);
    // A template chosen before this ran (or restored by the browser on "back") with the fields
    // still empty: show what it runs.
    var empty = FIELDS.every(function (name) {
      var field = form.querySelector("[name=" + name + "]");
      return !field || field.value === "";
    });
    if (select.value && empty) fill();
  }

  document.addEventListener("submit", function (event) {
    var form = event.target;
    var question = form && form.getAttribute && form.getAttribute("data-confirm");
    if (question && !window.confirm(question)) event.preventDefault();
  });

  document.querySelectorAll("form[data-template-fills]").forEach(setUpRentForm);
})();
