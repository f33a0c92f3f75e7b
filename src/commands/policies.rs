//! `routelab policies`: what the policy crate offers, as a readable table, generated from the
//! crate's catalog of policy parts (names, descriptions and defaults come from the crate).

use routelab_policies::catalog::{self, Part};
use std::io::Write;
use std::process::ExitCode;

/// Print the catalogue.
pub fn run(out: &mut impl Write) -> anyhow::Result<ExitCode> {
    section(out, "weights", &catalog::WEIGHTS)?;
    section(out, "chooser", &catalog::CHOOSERS)?;
    section(out, "affinity", &catalog::AFFINITIES)?;
    section(out, "cap", &catalog::CAPS)?;
    section(out, "prefix knowledge", &catalog::KNOWLEDGE)?;
    section(out, "presets", &catalog::PRESETS)?;
    let defaults = catalog::composition_defaults();
    // The defaults list is wrapped where the original prose wrapped it: after the chooser.
    let (first, rest) = defaults.split_once(", ").unwrap_or((&defaults, ""));
    writeln!(
        out,
        "\nA policy is a preset or a composition WEIGHTS[/CHOOSER[:TIES]][/AFFINITY][/CAP[:N]][/KNOWLEDGE[:DELAY_S]],\n\
         e.g. `at-load/sed/capacity/weighted:24`; omitted parts default to {first},\n\
         {rest}."
    )?;
    Ok(ExitCode::SUCCESS)
}

fn section(out: &mut impl Write, title: &str, rows: &[Part]) -> anyhow::Result<()> {
    writeln!(out, "{title}:")?;
    let width = rows.iter().map(|p| p.name.len()).max().unwrap_or(0);
    for p in rows {
        writeln!(out, "  {:<width$}  {}", p.name, p.description())?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use routelab_policies::{Affinity, Cap, Chooser, WeightsConfig};

    #[test]
    fn every_crate_name_is_described_with_the_crate_defaults() {
        let mut buf = Vec::new();
        run(&mut buf).unwrap();
        let text = String::from_utf8(buf).unwrap();
        for names in [
            WeightsConfig::NAMES,
            Chooser::NAMES,
            Affinity::NAMES,
            Cap::NAMES,
        ] {
            for n in names {
                assert!(text.contains(&format!("\n  {n} ")), "{n} missing");
            }
        }
        for p in catalog::PRESETS {
            assert!(text.contains(p.name), "{} missing", p.name);
        }
        let limit = Cap::DEFAULT_LIMIT;
        assert!(text.contains(&format!("(default {limit})")), "{text}");
        assert!(
            text.contains("omitted parts default to p2c:higher-weight,\ncapacity, flat:24."),
            "{text}"
        );
    }
}
