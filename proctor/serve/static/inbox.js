// Keyboard shortcuts on an approval page: "a" approves a call whose side effect is none, read or write;
// for an external or destructive call it only moves to the confirmation field, where the tool's name
// must be typed (the server checks it): no single keypress lets such a call run. "d" moves to the
// deny reason (Enter sends it).
// And a preview of what a grant would admit, asked of the server, before it is given.
(function () {
  document.addEventListener("keydown", function (e) {
    var t = e.target;
    if (e.ctrlKey || e.metaKey || e.altKey || (t && (t.tagName === "INPUT" || t.tagName === "TEXTAREA" || t.tagName === "SELECT"))) return;
    if (e.key === "a") {
      var c = document.getElementById("confirm"), f = document.getElementById("approve-form");
      if (c) { e.preventDefault(); c.focus(); } else if (f) { e.preventDefault(); f.submit(); }
    }
    if (e.key === "d") { var r = document.getElementById("deny-reason"); if (r) { e.preventDefault(); r.focus(); } }
  });
  var grant = document.getElementById("grant-form");
  if (grant) {
    var box = document.getElementById("grant-patterns"), out = document.getElementById("grant-preview");
    var show = function () {
      var q = "/api/approvals/" + encodeURIComponent(grant.dataset.approval) + "/grant-preview?patterns=" + encodeURIComponent(box.value || "{}");
      fetch(q, {credentials: "same-origin"}).then(function (r) { return r.json(); })
        .then(function (j) { out.textContent = j.admits ? "This grant admits " + j.admits.join("\n") : (j.error || ""); })
        .catch(function () { out.textContent = "(the patterns are not JSON yet)"; });
    };
    box.addEventListener("input", show); show();
  }
})();
