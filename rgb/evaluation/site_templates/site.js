// Sorting (by mouse or keyboard), search, "show N entries" with its pages, the filters of index.html and the
// ranking keys (rank, model, Sum, Borda) pinned while a wide table scrolls; the tables read without it. The view's state
// lives in the URL's hash (#search=...&setting=...&sort=...), written on every change and read on load, so a
// filtered view can be shared; a hash works from file:// too.
"use strict";

function cellKey(cell) {
  const raw = cell.dataset.value;
  if (raw !== undefined && raw !== "" && !isNaN(Number(raw))) return {num: Number(raw)};
  if (raw === "") return {num: null};
  return {text: cell.textContent.trim().toLowerCase()};
}

function compare(a, b) {
  if ("text" in a || "text" in b) return String(a.text ?? "").localeCompare(String(b.text ?? ""));
  if (a.num === null) return b.num === null ? 0 : 1;  // missing numbers last, whatever the direction
  if (b.num === null) return -1;
  return a.num - b.num;
}

// The page-wide sort: a column key (data-key of the header) and a direction; every table with that key follows.
const view = {sort: "", dir: ""};

function sortTable(header, direction) {
  const table = header.closest("table");
  const column = Array.from(header.parentNode.children).indexOf(header);
  table.querySelectorAll("thead th").forEach(th => th.setAttribute("aria-sort", "none"));
  header.setAttribute("aria-sort", direction);
  const body = table.tBodies[0];
  const rows = Array.from(body.rows);
  rows.sort((r1, r2) => {
    const a = cellKey(r1.cells[column]), b = cellKey(r2.cells[column]);
    if (a.num === null || b.num === null) return compare(a, b);
    return direction === "descending" ? -compare(a, b) : compare(a, b);
  });
  rows.forEach(row => body.appendChild(row));
}

function applySort() {
  if (!view.sort) return;
  document.querySelectorAll("table.sortable thead th").forEach(th => {
    if (th.dataset.key === view.sort) sortTable(th, view.dir);
  });
}

// A click sorts by the column; the first click on a score (accuracy, Sum, Borda) sorts best first.
function clickSort(header) {
  const current = header.getAttribute("aria-sort") === "none" ? null : header.getAttribute("aria-sort");
  const first = header.dataset.first || "ascending";
  const direction = current ? (current === "ascending" ? "descending" : "ascending") : first;
  if (header.dataset.key && header.closest("table.leaderboard")) {
    view.sort = header.dataset.key;
    view.dir = direction;
    applySort();
    writeState();
  } else {
    sortTable(header, direction);
  }
}

function controls() {
  const found = {search: document.getElementById("search"), show: document.getElementById("show")};
  document.querySelectorAll("#filters select[data-filter-column], #filters select[data-filter-row]").forEach(select => {
    found[select.dataset.filterColumn || select.dataset.filterRow] = select;
  });
  return found;
}

function chosen() {
  const values = {};
  for (const [key, control] of Object.entries(controls())) if (control) values[key] = control.value;
  return values;
}

// The page each leaderboard table shows after "show N" (by the table's place in the page; 0: the first).
const pages = [];

function applyFilters() {
  const state = chosen();
  const query = (state.search || "").trim().toLowerCase();
  const limit = state.show ? Number(state.show) : Infinity;
  document.querySelectorAll("section.board").forEach(section => {
    // a setting this board does not have (a transfer split on the white-box board): the board's tables go,
    // never a table with its setting columns hidden and a Sum over them left standing
    const off = Boolean(state.setting) && !section.dataset.settings.split(" ").includes(state.setting);
    section.querySelector(".board-tables").hidden = off;
    section.querySelector(".filtered-out").hidden = !off;
  });
  document.querySelectorAll("table.leaderboard [data-dataset]").forEach(cell => {
    const hide = (state.dataset && cell.dataset.dataset !== state.dataset) ||
                 (state.setting && cell.dataset.setting !== state.setting);
    cell.classList.toggle("hidden-col", Boolean(hide));
  });
  document.querySelectorAll("table.leaderboard").forEach((table, t) => {
    const rows = Array.from(table.tBodies[0].rows);
    const matches = rows.map(row =>
      !["family", "loss", "strategy"].some(key => state[key] && row.dataset[key] !== state[key]) &&
      (!query || row.dataset.search.includes(query)));
    const matching = matches.filter(Boolean).length;
    const last = limit === Infinity ? 0 : Math.max(Math.ceil(matching / limit) - 1, 0);
    const page = pages[t] = Math.min(pages[t] || 0, last);
    const first = limit === Infinity ? 0 : page * limit;
    let seen = 0, shown = 0;
    rows.forEach((row, i) => {
      const show = matches[i] && seen >= first && seen < first + limit;
      seen += matches[i] ? 1 : 0;
      shown += show ? 1 : 0;
      row.classList.toggle("hidden-row", !show);
    });
    const count = table.closest(".scroll").nextElementSibling;
    if (count && count.classList.contains("shown-count")) {
      const range = shown && limit !== Infinity ? `${first + 1}-${first + shown}` : `${shown}`;
      count.textContent = `Showing ${range} of ${matching} entries` +
        (matching < rows.length ? ` (filtered from ${rows.length})` : "");
      const pager = count.nextElementSibling;
      if (pager && pager.classList.contains("pager")) {
        pager.hidden = last === 0;
        pager.querySelector(".previous").disabled = page === 0;
        pager.querySelector(".next").disabled = page === last;
        pager.querySelector(".page-of").textContent = `page ${page + 1} of ${last + 1}`;
      }
    }
  });
  pinColumns();
}

// The ranking keys stay in view together while the settings scroll by: each pinned column sticks at the width of
// the pinned columns before it (measured, as names and Sums differ in width).
function pinColumns() {
  document.querySelectorAll("table.leaderboard").forEach(table => {
    const heads = Array.from(table.tHead.rows[0].cells);
    let left = 0;
    heads.forEach((th, column) => {
      if (!th.classList.contains("pin")) return;
      const offset = `${left}px`;
      th.style.left = offset;
      Array.from(table.tBodies[0].rows).forEach(row => { row.cells[column].style.left = offset; });
      left += th.getBoundingClientRect().width;
    });
    table.classList.add("pinned");
  });
}

function writeState() {
  const params = new URLSearchParams();
  for (const [key, value] of Object.entries(chosen())) if (value) params.set(key, value);
  if (view.sort) { params.set("sort", view.sort); params.set("dir", view.dir); }
  pages.forEach((page, t) => { if (page) params.set(`page${t + 1}`, page + 1); });
  const hash = params.toString();
  if (hash !== location.hash.slice(1)) location.replace("#" + hash);
}

function readState() {
  const params = new URLSearchParams(location.hash.slice(1));
  for (const [key, control] of Object.entries(controls())) {
    if (!control) continue;
    const value = params.get(key) || "";
    // a value the page has no option for (a stale link) is ignored, never an empty table
    if (control.tagName === "SELECT" && value && !Array.from(control.options).some(o => o.value === value)) continue;
    control.value = value;
  }
  document.querySelectorAll("table.leaderboard").forEach((_, t) => {
    pages[t] = Math.max(Number(params.get(`page${t + 1}`)) - 1 || 0, 0);
  });
  view.sort = params.get("sort") || "";
  view.dir = params.get("dir") === "ascending" ? "ascending" : "descending";
  applySort();
  applyFilters();
}

// Every sortable header is a control of its own: reached by Tab, sorted by Enter or Space, its state in aria-sort.
document.querySelectorAll("table.sortable thead th").forEach(th => {
  th.tabIndex = 0;
  if (!th.hasAttribute("aria-sort")) th.setAttribute("aria-sort", "none");
  th.addEventListener("click", () => clickSort(th));
  th.addEventListener("keydown", event => {
    if (event.key !== "Enter" && event.key !== " ") return;
    event.preventDefault();  // Space would scroll the page
    clickSort(th);
  });
});
document.querySelectorAll("table.leaderboard").forEach((table, t) => {
  const pager = table.closest(".scroll").nextElementSibling.nextElementSibling;
  [["previous", -1], ["next", 1]].forEach(([name, step]) => pager.querySelector(`.${name}`).addEventListener(
    "click", () => { pages[t] = Math.max((pages[t] || 0) + step, 0); applyFilters(); writeState(); }));
});
Object.values(controls()).forEach(control => {
  if (!control) return;
  control.addEventListener(control.tagName === "INPUT" ? "input" : "change", () => {
    pages.fill(0);  // a new search or page size starts at the first page
    applyFilters();
    writeState();
  });
});
window.addEventListener("resize", pinColumns);
window.addEventListener("hashchange", readState);
if (document.getElementById("filters")) readState();
