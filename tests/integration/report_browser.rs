//! `report.html` of `run`, `compare` and `capacity` opened in a real headless Chromium (through
//! `routelab-testkit`'s WebDriver client) at 1,280 px: the tables fit without horizontal
//! scrolling, every chart rendered, and the page opens with its one-sentence verdict (for
//! `capacity`: the policy to ship, and its chart reads at a glance).
//!
//! Needs the Debian packages `chromium` and `chromium-driver` (`.ci/run` installs them).

use super::common::{azure_slice, routelab, scratch, text};
use routelab_testkit::{Browser, ChromeDriver};
use serde_json::Value;
use std::path::Path;

/// One headless Chromium at a time: two starting at once on a loaded 2-core machine timed out
/// ("cannot start headless Chromium").
static ONE_BROWSER: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The browser window's width: the report must read without horizontal scrolling at it.
const WIDTH: u32 = 1280;

/// Measured in the page: the document's width, each table's width against its container's,
/// every `<img>` loaded, every inline `<svg>` drawn with a size, and the opening sentence with
/// its place among the page's blocks.
const MEASURE: &str = r#"
const tables = [...document.querySelectorAll('table')].map(t => ({
  scroll: t.scrollWidth,
  room: t.parentElement.clientWidth,
  right: t.getBoundingClientRect().right,
}));
const images = [...document.images].map(i => ({
  src: i.src, loaded: i.complete && i.naturalWidth > 0,
}));
const svgs = [...document.querySelectorAll('svg')].map(s => {
  const r = s.getBoundingClientRect();
  return { width: r.width, height: r.height };
});
const lead = document.querySelector('p.lead');
const first = document.querySelector('table');
return {
  page: document.documentElement.scrollWidth,
  viewport: document.documentElement.clientWidth,
  tables, images, svgs,
  lead: lead ? lead.textContent : null,
  lead_before_tables: !!(lead && first &&
    (lead.compareDocumentPosition(first) & Node.DOCUMENT_POSITION_FOLLOWING)),
};
"#;

/// Open `report` at [`WIDTH`] px and measure it.
async fn measure(browser: &Browser, report: &Path) -> Value {
    browser.go(&format!("file://{}", report.display())).await;
    let m = browser
        .execute(MEASURE, Vec::new())
        .await
        .unwrap_or_else(|e| panic!("measuring {}: {e}", report.display()));
    if let Some(dir) = std::env::var_os("ROUTELAB_REPORT_SCREENSHOTS") {
        let name = report
            .parent()
            .and_then(|p| p.file_name())
            .map_or_else(|| "report".into(), |n| n.to_string_lossy().into_owned());
        browser
            .screenshot(&Path::new(&dir).join(format!("{name}.png")))
            .await;
    }
    m
}

/// What every report must satisfy at 1,280 px; `charts`: the inline SVG charts it holds.
fn assert_readable(what: &str, m: &Value, charts: usize) {
    assert_readable_with(what, m, charts, 2);
}

/// [`assert_readable`] for a page of at least `min_tables` tables.
fn assert_readable_with(what: &str, m: &Value, charts: usize, min_tables: usize) {
    let page = m["page"].as_f64().unwrap();
    assert!(
        page <= f64::from(WIDTH),
        "{what}: the page is {page} px wide: {m}"
    );
    let viewport = m["viewport"].as_f64().unwrap();
    assert!(
        page <= viewport,
        "{what}: the page scrolls sideways ({page} > {viewport} px)"
    );
    let tables = m["tables"].as_array().unwrap();
    assert!(tables.len() >= min_tables, "{what}: tables {m}");
    for (i, t) in tables.iter().enumerate() {
        let (scroll, room) = (t["scroll"].as_f64().unwrap(), t["room"].as_f64().unwrap());
        assert!(
            scroll <= room,
            "{what}: table {i} is {scroll} px in {room} px: {m}"
        );
        assert!(
            t["right"].as_f64().unwrap() <= viewport,
            "{what}: table {i} leaves the window"
        );
    }
    for img in m["images"].as_array().unwrap() {
        assert_eq!(img["loaded"], true, "{what}: image not loaded: {img}");
    }
    let svgs = m["svgs"].as_array().unwrap();
    assert_eq!(svgs.len(), charts, "{what}: inline charts {m}");
    for s in svgs {
        let (w, h) = (s["width"].as_f64().unwrap(), s["height"].as_f64().unwrap());
        assert!(w > 100.0 && h > 100.0, "{what}: a chart drawn {w} × {h} px");
        assert!(w <= viewport, "{what}: a chart wider than the window");
    }
    assert_eq!(
        m["lead_before_tables"], true,
        "{what}: the page opens with its sentence, before any table: {m}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_and_compare_reports_fit_1280_px_in_a_real_browser() {
    let dir = scratch("report-browser");
    let run_dir = dir.join("run");
    let cmp_dir = dir.join("compare");
    let scenario = "scenarios/seed/burst-probe.yaml";
    let o = routelab(&["run", scenario, "--out", run_dir.to_str().unwrap()]);
    assert!(o.status.success(), "{}", text(&o));
    let o = routelab(&[
        "compare",
        scenario,
        "--seeds",
        "2",
        "--out",
        cmp_dir.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", text(&o));

    let _one = ONE_BROWSER.lock().await;
    let driver = ChromeDriver::start().await;
    let browser = Browser::open(&driver, (WIDTH, 1000)).await;

    let run = measure(&browser, &run_dir.join("report.html")).await;
    // ttft_cdf, e2e_cdf, share, weights, in_flight.
    assert_readable("run", &run, 5);
    let lead = run["lead"].as_str().unwrap();
    assert!(lead.contains("has the lowest e2e mean"), "{lead}");
    assert!(lead.contains("one seed gives no interval"), "{lead}");
    assert!(lead.contains("routelab compare"), "{lead}");

    let cmp = measure(&browser, &cmp_dir.join("report.html")).await;
    // Per scenario: the bars and the CDF.
    assert_readable("compare", &cmp, 2);
    let lead = cmp["lead"].as_str().unwrap();
    assert!(
        lead.contains(" wins on e2e mean ") || lead.contains(" are tied on e2e mean "),
        "{lead}"
    );
    assert!(lead.contains("(95 % interval, 2 seeds)"), "{lead}");

    browser.close().await;
    drop(driver);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// What the capacity chart shows, read from its inline SVG in the page: the 95 % bands (shaded
/// polygons), the knees (four-cornered filled polygons outlined in black: diamonds, a shape no
/// data series uses), every text of the chart (the target's label, the policies' names).
const CHART: &str = r#"
const svg = document.querySelector('svg');
const polys = [...svg.querySelectorAll('polygon')];
const corners = p => p.getAttribute('points').trim().split(/\s+/).length;
return {
  bands: polys.filter(p => p.getAttribute('opacity') === '0.16').length,
  diamonds: polys.filter(p => p.getAttribute('opacity') === '1' && corners(p) === 4).length,
  texts: [...svg.querySelectorAll('text')].map(t => t.textContent.trim()),
  leads: [...document.querySelectorAll('p.lead')].map(p => p.textContent),
};
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_capacity_report_says_what_to_ship_and_its_chart_reads_at_a_glance() {
    let dir = scratch("capacity-browser");
    let scenario = azure_slice(&dir, "test/capacity-browser");
    let out = dir.join("capacity");
    let o = routelab(&[
        "capacity",
        scenario.to_str().unwrap(),
        "--slo",
        "ttft<=2s,tpot<=100ms",
        "--target",
        "0.9",
        "--seeds",
        "3",
        "--holdout",
        "0.3",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let console = text(&o);
    assert!(console.contains("Ship `seed-v3`: it carries "), "{console}");

    let _one = ONE_BROWSER.lock().await;
    let driver = ChromeDriver::start().await;
    let browser = Browser::open(&driver, (WIDTH, 1000)).await;
    let page = measure(&browser, &out.join("report.html")).await;
    // One table (a row per policy) and one chart (the curve and the bars).
    assert_readable_with("capacity", &page, 1, 1);
    let chart = browser.execute(CHART, Vec::new()).await.unwrap();
    let leads: Vec<&str> = chart["leads"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l.as_str().unwrap())
        .collect();
    // The page opens with what to ship (the console's sentence), then the out-of-sample check.
    assert!(
        leads[0].starts_with("Ship `seed-v3`: it carries ")
            && leads[0].contains("round robin's load"),
        "{leads:?}"
    );
    assert!(
        leads[1].starts_with("Out of sample (the last 30 % of each trace's span held out"),
        "{leads:?}"
    );
    // Round robin (added as the baseline), seed-v1 and seed-v3: a band and a diamond each.
    assert_eq!(chart["bands"], 3, "{chart}");
    assert_eq!(chart["diamonds"], 3, "{chart}");
    let texts: Vec<&str> = chart["texts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap())
        .collect();
    assert!(
        texts.contains(&"target 90.0%"),
        "the target line: {texts:?}"
    );
    for name in ["equal/round-robin/none/none", "seed-v1", "seed-v3"] {
        assert!(texts.contains(&name), "legend {name}: {texts:?}");
    }
    browser.close().await;
    drop(driver);
    std::fs::remove_dir_all(&dir).unwrap();
}
