"""Drives the console in headless Chromium, as an operator would.

Run by tests/console.rs against a 3-node cluster it started, with a job it
failed into an incident and a worker that completes the job's next attempt:

    browse.py URL JOB_KEY SCREENSHOT_DIR JOB_TYPE

Opens the cluster page (three nodes, every partition with a leader), finds the
incident on the incidents page, opens its job page and history timeline,
presses retry, and waits for the page to show the job completed by the
worker. Then finds the job's queue on the queues page, with the completion
counted, and pauses it; the schedule "hourly-digest" on the schedules
page, with its next run, and pauses it; and the chain "console-chain" on
the workflows page, with its steps, and cancels it. Saves a screenshot of each page in SCREENSHOT_DIR. Exits non-zero,
with what it saw, when a step does not hold.
"""

import os
import sys
import time

from selenium import webdriver
from selenium.common.exceptions import WebDriverException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By

url, key, shots, job_type = sys.argv[1].rstrip("/"), sys.argv[2], sys.argv[3], sys.argv[4]
os.makedirs(shots, exist_ok=True)

options = webdriver.ChromeOptions()
options.binary_location = os.environ.get("DROVER_CHROMIUM", "/usr/bin/chromium")
# No background traffic: the machine may have no network, and a page's test
# should not wait on lookups Chromium makes for itself.
for flag in (
    "--headless=new",
    "--no-sandbox",
    "--disable-dev-shm-usage",
    "--disable-gpu",
    "--window-size=1360,900",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-quic",
):
    options.add_argument(flag)
service = Service(executable_path=os.environ.get("DROVER_CHROMEDRIVER", "/usr/bin/chromedriver"))
driver = webdriver.Chrome(service=service, options=options)
driver.set_page_load_timeout(30)


def fail(message):
    print(f"FAILED: {message}\nat {driver.current_url}\n--- page text ---\n{page_text()}", file=sys.stderr)
    driver.quit()
    sys.exit(1)


def page_text():
    try:
        return driver.find_element(By.TAG_NAME, "body").text
    except WebDriverException as e:
        return f"(no page: {e})"


def shot(name):
    # A full-page screenshot: the window grows to the page's height.
    height = driver.execute_script("return document.documentElement.scrollHeight")
    driver.set_window_size(1360, max(900, min(height + 40, 4000)))
    driver.save_screenshot(os.path.join(shots, name))
    driver.set_window_size(1360, 900)


def until(what, check, limit=30.0, reload=False):
    """Waits (bounded) for check() to hold, reloading the page between tries when asked."""
    deadline = time.monotonic() + limit
    while True:
        try:
            if check():
                return
        except WebDriverException:
            pass
        if time.monotonic() > deadline:
            fail(f"{what}: not within {limit:.0f} s")
        time.sleep(0.25)
        if reload:
            driver.refresh()


try:
    # The cluster: three nodes, each partition led by one of them.
    driver.get(url + "/console")
    nodes = driver.find_elements(By.CSS_SELECTOR, "#nodes tbody tr")
    if len(nodes) != 3:
        fail(f"the cluster page lists {len(nodes)} nodes, not 3")
    partitions = driver.find_elements(By.CSS_SELECTOR, "#partitions tbody tr")
    if not partitions or any("none" in row.find_elements(By.TAG_NAME, "td")[1].text for row in partitions):
        fail("a partition has no leader on the cluster page")
    shot("cluster.png")

    # The incident, found from the incidents page.
    driver.get(url + "/console/incidents")
    rows = driver.find_elements(By.CSS_SELECTOR, f'#jobs tr[data-key="{key}"]')
    if not rows:
        fail(f"job {key} is not among the incidents")
    if "card declined" not in rows[0].text:
        fail(f"the incident row does not show the worker's error: {rows[0].text!r}")
    shot("incidents.png")
    rows[0].find_element(By.LINK_TEXT, key).click()

    # Its page: state incident, and a timeline that tells how it got there.
    until("the job page", lambda: driver.find_element(By.ID, "job-state").text == "incident")
    kinds = [e.text for e in driver.find_elements(By.CSS_SELECTOR, "#history .kind")]
    for wanted in ("created", "activated", "failed", "incident"):
        if wanted not in kinds:
            fail(f"the history lacks {wanted!r}: {kinds}")
    if kinds.index("created") > kinds.index("activated") or kinds.index("failed") > kinds.index("incident"):
        fail(f"the history is out of order: {kinds}")
    shot("job-incident.png")

    # Retry, and the worker completes the next attempt.
    driver.find_element(By.CSS_SELECTOR, "#retry button").click()
    until("the retry notice", lambda: "Retries set" in driver.find_element(By.CLASS_NAME, "notice").text)
    until(
        "the job completed by the worker",
        lambda: driver.find_element(By.ID, "job-state").text == "completed",
        reload=True,
    )
    kinds = [e.text for e in driver.find_elements(By.CSS_SELECTOR, "#history .kind")]
    if "retries updated" not in kinds or kinds.index("retries updated") < kinds.index("incident"):
        fail(f"the history lacks the retry after the incident: {kinds}")
    if kinds[-1] != "completed":
        fail(f"the history does not end completed: {kinds}")
    shot("job-completed.png")

    # The worker's session, and a search.
    driver.get(url + "/console/workers")
    if not driver.find_elements(By.CSS_SELECTOR, "#sessions tbody tr"):
        fail("no worker session on the workers page")
    shot("workers.png")
    driver.get(url + "/console/jobs?state=completed")
    if not driver.find_elements(By.CSS_SELECTOR, f'#jobs tr[data-key="{key}"]'):
        fail(f"job {key} is not found by a search for completed jobs")
    shot("jobs.png")

    # The job's queue: the completion counted, running; then paused, after
    # the operator confirms.
    driver.get(url + "/console/queues")
    row_of = f'#queues tr[data-queue="<default>/{job_type}"]'
    rows = driver.find_elements(By.CSS_SELECTOR, row_of)
    if not rows:
        fail(f"the queue of {job_type} is not on the queues page")
    if rows[0].find_element(By.CLASS_NAME, "state").text != "running":
        fail(f"the queue is not running: {rows[0].text!r}")
    if int(rows[0].find_element(By.CLASS_NAME, "completed").text) < 1:
        fail(f"the queue's completions in the last hour do not count the job: {rows[0].text!r}")
    shot("queues.png")
    rows[0].find_element(By.CSS_SELECTOR, "button.pause").click()
    driver.switch_to.alert.accept()
    until("the pause notice", lambda: "paused" in driver.find_element(By.CLASS_NAME, "notice").text)
    state = driver.find_element(By.CSS_SELECTOR, row_of + " .state").text
    if not state.startswith("paused"):
        fail(f"the queue does not show paused after the pause: {state!r}")
    if not driver.find_elements(By.CSS_SELECTOR, row_of + " button.resume"):
        fail("a paused queue offers no resume")
    shot("queues-paused.png")
    # A limited queue with no job yet shows its limit and what it holds.
    limited = driver.find_elements(By.CSS_SELECTOR, '#queues tr[data-queue="<default>/limited-mail"] .limit')
    if not limited:
        fail("the limited queue is not on the queues page")
    said = limited[0].text
    if "5 per 1000 ms" not in said or "2 at once" not in said or "home partition" not in said:
        fail(f"the limited queue's limit reads {said!r}")

    # The schedule: active with a next run; then paused.
    driver.get(url + "/console/schedules")
    row_of = '#schedules tr[data-schedule="<default>/hourly-digest"]'
    rows = driver.find_elements(By.CSS_SELECTOR, row_of)
    if not rows:
        fail("the schedule hourly-digest is not on the schedules page")
    if rows[0].find_element(By.CLASS_NAME, "state").text != "active":
        fail(f"the schedule is not active: {rows[0].text!r}")
    if "UTC" not in rows[0].find_element(By.CLASS_NAME, "next").text:
        fail(f"the schedule shows no next run: {rows[0].text!r}")
    shot("schedules.png")
    rows[0].find_element(By.CSS_SELECTOR, "button.pause").click()
    until("the schedule's pause notice", lambda: "paused" in driver.find_element(By.CLASS_NAME, "notice").text)
    state = driver.find_element(By.CSS_SELECTOR, row_of + " .state").text
    if state != "paused":
        fail(f"the schedule does not show paused after the pause: {state!r}")
    shot("schedules-paused.png")

    # The chain: running at its first step; then cancelled.
    driver.get(url + "/console/workflows")
    row_of = '#workflows tr[data-workflow="<default>/console-chain"]'
    rows = driver.find_elements(By.CSS_SELECTOR, row_of)
    if not rows:
        fail("the workflow console-chain is not on the workflows page")
    if rows[0].find_element(By.CLASS_NAME, "state").text != "running":
        fail(f"the workflow is not running: {rows[0].text!r}")
    steps = [li.get_attribute("data-state") for li in rows[0].find_elements(By.CSS_SELECTOR, "li.step")]
    if steps != ["created", "waiting"]:
        fail(f"the chain's steps are {steps!r}, not its first made and its second waiting")
    shot("workflows.png")
    rows[0].find_element(By.CSS_SELECTOR, "button.cancel").click()
    driver.switch_to.alert.accept()
    until("the workflow's cancel notice", lambda: "cancelled" in driver.find_element(By.CLASS_NAME, "notice").text)
    state = driver.find_element(By.CSS_SELECTOR, row_of + " .state").text
    if state != "cancelled":
        fail(f"the workflow does not show cancelled after the cancel: {state!r}")
    steps = [li.get_attribute("data-state") for li in driver.find_elements(By.CSS_SELECTOR, row_of + " li.step")]
    if steps != ["cancelled", "cancelled"]:
        fail(f"after the cancel the chain's steps are {steps!r}")
    shot("workflows-cancelled.png")
    print(f"console: incident {key} found, retried and completed; its queue and a schedule paused; a workflow "
          f"cancelled; screenshots in {shots}")
finally:
    driver.quit()
