//! `docs/findings.md` is written by four commands and a script: `compare --findings` writes
//! the document, `capacity --findings` its capacity section, `replicas --findings` its replicas
//! section, `h2h --findings` its "Against the originals" section,
//! `scripts/weight-error-findings` its weight-error section and `scripts/sita-oracle`'s lines
//! its `sita-oracle` section.
//! Each generated section sits between two marker comments, so each command can regenerate its
//! part and keep the others'.

/// The section `capacity --findings` writes.
pub const CAPACITY: &str = "capacity";

/// The section `replicas --findings` writes.
pub const REPLICAS: &str = "replicas";

/// The section comparing weight strategies against both weight-error references, made from
/// `compare`'s output by `scripts/weight-error-findings`.
pub const WEIGHT_ERROR: &str = "weight-error";

/// The section `h2h --findings` writes: ours against the field's real routers, and the lab's
/// copies of them checked against the originals.
pub const AGAINST_ORIGINALS: &str = "against-originals";

/// `predictive` against the oracle-tuned `sita` (issue 38), the table made from
/// `scripts/sita-oracle`'s lines.
pub const SITA_ORACLE: &str = "sita-oracle";

/// The sections generated apart from `compare --findings`'s document, in the order it keeps
/// them after its own text.
pub const GENERATED_APART: &[&str] = &[
    CAPACITY,
    REPLICAS,
    WEIGHT_ERROR,
    AGAINST_ORIGINALS,
    SITA_ORACLE,
];

/// Each section of [`GENERATED_APART`] that `doc` has, whole (markers included), in that
/// order: what `compare --findings` keeps when it rewrites the document.
pub fn kept_sections(doc: &str) -> Vec<String> {
    GENERATED_APART
        .iter()
        .filter_map(|name| section(doc, name).map(str::to_string))
        .collect()
}

/// The comment that opens the generated section `name`.
fn begin(name: &str) -> String {
    format!("<!-- routelab:{name}:begin (generated; do not edit by hand) -->")
}

/// The comment that closes it.
fn end(name: &str) -> String {
    format!("<!-- routelab:{name}:end -->")
}

/// `content` wrapped in the section's markers, ready to splice or append.
pub fn marked(name: &str, content: &str) -> String {
    let mut s = begin(name);
    s.push('\n');
    s.push_str(content);
    if !content.ends_with('\n') {
        s.push('\n');
    }
    s.push_str(&end(name));
    s.push('\n');
    s
}

/// The whole marked section `name` of `doc` (markers included), if it has one.
pub fn section<'a>(doc: &'a str, name: &str) -> Option<&'a str> {
    let (b, e) = (begin(name), end(name));
    let start = doc.find(&b)?;
    let stop = start + doc[start..].find(&e)? + e.len();
    let stop = if doc[stop..].starts_with('\n') {
        stop + 1
    } else {
        stop
    };
    Some(&doc[start..stop])
}

/// Every marked section of `doc` whose name starts with `prefix`, in document order, as
/// `(name, whole section with markers)`.
pub fn sections_with_prefix<'a>(doc: &'a str, prefix: &str) -> Vec<(String, &'a str)> {
    let opening = format!("<!-- routelab:{prefix}");
    let mut found = Vec::new();
    let mut at = 0;
    while let Some(k) = doc[at..].find(&opening) {
        let start = at + k;
        let rest = &doc[start + "<!-- routelab:".len()..];
        let Some(colon) = rest.find(":begin") else {
            break;
        };
        let name = &rest[..colon];
        match section(&doc[start..], name) {
            Some(whole) => {
                found.push((name.to_string(), whole));
                at = start + whole.len();
            }
            None => at = start + opening.len(),
        }
    }
    found
}

/// `doc` with the section `section` rewritten as `header` followed by its parts: each new part
/// (`(name, content)`, its name starting with `<section>/`) replaces the part of that name if the
/// section has it, else is appended; the parts not given are kept in place. How `capacity
/// --findings` and `replicas --findings` each update their section one study at a time.
pub fn update_parts(
    doc: &str,
    section_name: &str,
    header: &str,
    new_parts: impl IntoIterator<Item = (String, String)>,
) -> String {
    let old_section = section(doc, section_name).unwrap_or("");
    let prefix = format!("{section_name}/");
    let mut parts: Vec<(String, String)> = sections_with_prefix(old_section, &prefix)
        .into_iter()
        .map(|(name, whole)| (name, whole.to_string()))
        .collect();
    for (name, content) in new_parts {
        let new = marked(&name, &content);
        // A part written before per-request bounds lost their statistic (`ttft_p99<=2s` with a
        // target, now `ttft<=2s`) is the same study: it is replaced in place, not kept twice.
        match parts
            .iter_mut()
            .find(|(n, _)| *n == name || per_request_spelling(n).as_deref() == Some(&name))
        {
            Some(slot) => *slot = (name, new),
            None => parts.push((name, new)),
        }
    }
    let mut content = String::from(header);
    for (_, part) in &parts {
        content.push('\n');
        content.push_str(part);
    }
    splice(doc, section_name, &content)
}

/// The name of a part of a per-request study (one with ` target ` in its name) as written
/// before a per-request bound lost its statistic: every `METRIC_STAT<=` of the name becomes
/// `METRIC<=`. `None` for any other name.
fn per_request_spelling(name: &str) -> Option<String> {
    if !name.contains(" target ") || !name.contains('_') {
        return None;
    }
    let mut out = String::with_capacity(name.len());
    let mut rest = name;
    while let Some(k) = rest.find("<=") {
        let head = &rest[..k];
        let token_start = head.rfind([' ', ',']).map_or(0, |i| i + 1);
        match head[token_start..].find('_') {
            Some(u) => out.push_str(&head[..token_start + u]),
            None => out.push_str(head),
        }
        out.push_str("<=");
        rest = &rest[k + 2..];
    }
    out.push_str(rest);
    (out != name).then_some(out)
}

/// `doc` with its section `name` replaced by `content` (appended after a blank line when the
/// document has none yet).
pub fn splice(doc: &str, name: &str, content: &str) -> String {
    let new = marked(name, content);
    match section(doc, name) {
        Some(old) => {
            let start = doc.find(old).expect("the section was found in doc");
            format!("{}{new}{}", &doc[..start], &doc[start + old.len()..])
        }
        None if doc.is_empty() => new,
        None => {
            let sep = if doc.ends_with("\n\n") {
                ""
            } else if doc.ends_with('\n') {
                "\n"
            } else {
                "\n\n"
            };
            format!("{doc}{sep}{new}")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_section_is_appended_then_replaced_in_place() {
        let doc = "# Findings\n\ntext\n";
        let once = splice(doc, "capacity", "## Capacity\n\nv1\n");
        assert!(once.starts_with("# Findings\n\ntext\n\n<!-- routelab:capacity:begin"));
        assert_eq!(
            section(&once, "capacity"),
            Some(marked("capacity", "## Capacity\n\nv1\n").as_str())
        );
        let with_tail = format!("{once}\n## After\n");
        let twice = splice(&with_tail, "capacity", "## Capacity\n\nv2");
        assert!(twice.contains("v2\n<!-- routelab:capacity:end -->\n\n## After\n"));
        assert!(!twice.contains("v1"));
        assert_eq!(twice.matches("routelab:capacity:begin").count(), 1);
        assert_eq!(section("no markers", "capacity"), None);
        assert_eq!(splice("", "x", "c"), marked("x", "c"));
    }

    #[test]
    fn compare_keeps_the_capacity_and_replicas_sections_in_order() {
        let doc = format!(
            "# Findings\n{}{}{}",
            marked(REPLICAS, "R"),
            marked("other", "O"),
            marked(CAPACITY, "C")
        );
        assert_eq!(
            kept_sections(&doc),
            [marked(CAPACITY, "C"), marked(REPLICAS, "R")]
        );
        assert!(kept_sections("# Findings\n").is_empty());
        // Splicing one keeps the other.
        let capacity_again = splice(&doc, CAPACITY, "C2");
        assert_eq!(section(&capacity_again, REPLICAS), section(&doc, REPLICAS));
    }

    #[test]
    fn a_per_request_part_written_with_statistics_is_replaced_in_place() {
        let old = "capacity/traces/azure-conv at ttft_p99<=2s,tpot_p99<=100ms target 0.9";
        let new = "capacity/traces/azure-conv at ttft<=2s,tpot<=100ms target 0.9";
        assert_eq!(per_request_spelling(old).as_deref(), Some(new));
        assert_eq!(per_request_spelling(new), None);
        assert_eq!(
            per_request_spelling("capacity/a_b at ttft_p99<=2s"),
            None,
            "a distribution study keeps its statistics"
        );
        let doc = splice(
            "# F\n",
            "capacity",
            &format!("H\n{}{}", marked(old, "old"), marked("capacity/z", "Z")),
        );
        let updated = update_parts(&doc, "capacity", "H\n", [(new.to_string(), "new".into())]);
        assert!(
            !updated.contains("old") && updated.contains("new"),
            "{updated}"
        );
        assert!(updated.find(new).unwrap() < updated.find("capacity/z").unwrap());
    }

    #[test]
    fn sections_with_a_prefix_are_listed_in_order() {
        let doc = format!(
            "{}text\n{}{}",
            marked("cap/a", "A"),
            marked("other", "O"),
            marked("cap/b", "B")
        );
        let found = sections_with_prefix(&doc, "cap/");
        let names: Vec<&str> = found.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["cap/a", "cap/b"]);
        assert_eq!(found[1].1, marked("cap/b", "B"));
        assert!(sections_with_prefix(&doc, "none").is_empty());
    }
}
