// Sorting by a click on any column header and the filters of index.html; the tables read without it.
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

function sortBy(header) {
  const table = header.closest("table");
  const column = Array.from(header.parentNode.children).indexOf(header);
  const descending = header.getAttribute("aria-sort") === "ascending";
  table.querySelectorAll("thead th").forEach(th => th.removeAttribute("aria-sort"));
  header.setAttribute("aria-sort", descending ? "descending" : "ascending");
  const body = table.tBodies[0];
  const rows = Array.from(body.rows);
  rows.sort((r1, r2) => {
    const a = cellKey(r1.cells[column]), b = cellKey(r2.cells[column]);
    if (a.num === null || b.num === null) return compare(a, b);
    return descending ? -compare(a, b) : compare(a, b);
  });
  rows.forEach(row => body.appendChild(row));
}

function applyFilters() {
  const chosen = {};
  document.querySelectorAll("#filters select").forEach(select => {
    const key = select.dataset.filterColumn || select.dataset.filterRow;
    chosen[key] = select.value;
  });
  document.querySelectorAll("[data-dataset]").forEach(cell => {
    const hide = (chosen.dataset && cell.dataset.dataset !== chosen.dataset) ||
                 (chosen.setting && cell.dataset.setting !== chosen.setting);
    cell.classList.toggle("hidden-col", Boolean(hide));
  });
  document.querySelectorAll("tbody tr[data-family]").forEach(row => {
    const hide = ["family", "loss", "strategy"].some(key => chosen[key] && row.dataset[key] !== chosen[key]);
    row.classList.toggle("hidden-row", hide);
  });
}

document.querySelectorAll("table.sortable thead th").forEach(th => th.addEventListener("click", () => sortBy(th)));
document.querySelectorAll("#filters select").forEach(select => select.addEventListener("change", applyFilters));
