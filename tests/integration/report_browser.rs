//! `report.html` of `run` and `compare` opened in a real headless Chromium (through
//! `routelab-testkit`'s WebDriver client) at 1,280 px: the tables fit without horizontal
//! scrolling, every chart rendered, and the page opens with its one-sentence verdict.
//!
//! Needs the Debian packages `chromium` and `chromium-driver` (`.ci/run` installs them).

use super::common::{routelab, scratch, text};
use routelab_testkit::{Browser, ChromeDriver};
use serde_json::Value;
use std::path::Path;

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
    assert!(tables.len() >= 2, "{what}: tables {m}");
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
