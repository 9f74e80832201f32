// The console's little script: confirm before destructive forms, and an
// opt-in auto-refresh on pages that offer it.
document.addEventListener("submit", (event) => {
  const message = event.target.dataset.confirm;
  if (message && !window.confirm(message)) event.preventDefault();
});
for (const box of document.querySelectorAll("input[data-refresh]")) {
  const key = "drover-refresh:" + location.pathname;
  box.checked = sessionStorage.getItem(key) === "on";
  let timer = null;
  const arm = () => {
    clearTimeout(timer);
    if (box.checked) timer = setTimeout(() => location.reload(), Number(box.dataset.refresh) * 1000);
  };
  box.addEventListener("change", () => {
    sessionStorage.setItem(key, box.checked ? "on" : "off");
    arm();
  });
  arm();
}
