(function () {
  "use strict";
  /* rootbench report: search, filter and sort the episodes. This text is hashed into the
     page's Content-Security-Policy (script-src 'sha256-...'): no other script can run. It
     reads the page and hides or reorders elements; it never writes markup, so text from a
     guest or a model stays text. Without it the page shows every episode, as recorded. */
  /* A report of many episodes keeps each trajectory in a <template class="lazy">: drawn (its
     parsed nodes moved into the page, never markup made from text) when its episode opens. */
  function draw(el) {
    var tpl = el.querySelector("template.lazy");
    if (tpl) { tpl.parentNode.replaceChild(tpl.content, tpl); }
  }
  Array.prototype.forEach.call(document.querySelectorAll("details.episode"), function (el) {
    el.addEventListener("toggle", function () { if (el.open) { draw(el); } });
  });
  function openLinked() {  /* a link to an episode (the table's, a URL's #anchor) opens it */
    var target = location.hash ? document.getElementById(location.hash.slice(1)) : null;
    if (target && target.matches("details.episode")) { target.open = true; draw(target); }
  }
  window.addEventListener("hashchange", openLinked);
  openLinked();
  var bar = document.getElementById("filters");
  if (!bar) { return; }
  var field = function (id) { return document.getElementById(id); };
  var search = field("f-search"), verdict = field("f-verdict"), scenario = field("f-scenario"),
      tag = field("f-tag"), run = field("f-run"), level = field("f-level"), order = field("f-sort"),
      unsafe = field("f-unsafe"), count = field("f-count");
  var episodes = Array.prototype.slice.call(document.querySelectorAll("details.episode[data-ep]"));
  var rows = Array.prototype.slice.call(document.querySelectorAll("tr[data-ep]"));
  var texts = {};
  episodes.forEach(function (el) {
    var tpl = el.querySelector("template.lazy");
    texts[el.id] = (el.textContent + " " + (tpl ? tpl.content.textContent : "")).toLowerCase();
  });

  function matches(el) {
    var d = el.dataset, words = search.value.trim().toLowerCase();
    return (!verdict.value || d.verdict === verdict.value) &&
      (!scenario.value || d.scenario === scenario.value) &&
      (!run.value || d.run === run.value) &&
      (!level.value || d.level === level.value) &&
      (!unsafe.value || d.unsafe === unsafe.value) &&
      (!tag.value || (" " + d.tags + " ").indexOf(" " + tag.value + " ") >= 0) &&
      (!words || texts[el.id].indexOf(words) >= 0);
  }

  function key(el) {
    var how = order.value.split("-"), v = Number(el.dataset[how[0]]);
    return how[1] === "desc" ? -v : v;
  }

  function reorder(items) {
    var parents = [];
    items.forEach(function (el) {
      if (parents.indexOf(el.parentNode) < 0) { parents.push(el.parentNode); }
    });
    parents.forEach(function (parent) {
      var mine = items.filter(function (el) { return el.parentNode === parent; });
      mine.sort(function (x, y) {
        var by = order.value ? key(x) - key(y) : 0;
        return by || Number(x.dataset.i) - Number(y.dataset.i);
      });
      mine.forEach(function (el) { parent.appendChild(el); });
    });
  }

  function apply() {
    var shown = {}, n = 0;
    episodes.forEach(function (el) {
      var ok = matches(el);
      el.hidden = !ok;
      shown[el.id] = ok;
      if (ok) { n += 1; }
    });
    rows.forEach(function (tr) { tr.hidden = !shown[tr.dataset.ep]; });
    reorder(episodes);
    reorder(rows);
    count.textContent = "showing " + n + " of " + episodes.length + " episodes";
  }

  [search, verdict, scenario, tag, run, level, unsafe, order].forEach(function (el) {
    el.addEventListener(el === search ? "input" : "change", apply);
  });
  field("f-reset").addEventListener("click", function () {
    search.value = "";
    [verdict, scenario, tag, run, level, unsafe, order].forEach(function (el) { el.value = ""; });
    apply();
  });
  bar.hidden = false;
  apply();
}());
