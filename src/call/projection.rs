//! Projection: turns a tool's raw JSON into the bounded result the agent sees. The declarative
//! projector (a tool's `projection` config) is a pure function; other projectors plug in
//! through [`Projector`].

use serde_json::{Map, Value, json};

use crate::compact;
use crate::config::Projection;
use crate::store::Evidence;

/// A projected result: what the agent is shown.
#[derive(Debug, Clone, PartialEq)]
pub struct Projected {
    pub evidence: Evidence,
    pub result: Value,
}

/// Why a projection failed. Never shown to the agent.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ProjectionError {
    #[error("pointer {0:?} does not resolve")]
    Unresolved(String),
    #[error("projector returned evidence status {0:?}")]
    BadEvidence(&'static str),
    #[error("raw response does not parse: {0}")]
    Parse(String),
}

/// A projected result in the form the agent is sent it and the record keeps it: compact JSON.
#[derive(Debug, Clone, PartialEq)]
pub struct ProjectedJson {
    pub evidence: Evidence,
    pub json: String,
}

/// Something that turns raw tool output into an agent result.
pub trait Projector: Send + Sync {
    fn project(&self, tool: &str, input: &Value, raw: &Value)
    -> Result<Projected, ProjectionError>;

    /// The same, given the raw tree to keep: what the result keeps can be moved, not copied.
    fn project_owned(
        &self,
        tool: &str,
        input: &Value,
        raw: Value,
    ) -> Result<Projected, ProjectionError> {
        self.project(tool, input, &raw)
    }
}

impl Projector for Projection {
    fn project(
        &self,
        tool: &str,
        input: &Value,
        raw: &Value,
    ) -> Result<Projected, ProjectionError> {
        let selected = raw
            .pointer(&self.select)
            .ok_or_else(|| ProjectionError::Unresolved(self.select.clone()))?;
        Ok(self.shape(tool, input, selected.clone()))
    }

    fn project_owned(
        &self,
        tool: &str,
        input: &Value,
        mut raw: Value,
    ) -> Result<Projected, ProjectionError> {
        let selected = raw
            .pointer_mut(&self.select)
            .ok_or_else(|| ProjectionError::Unresolved(self.select.clone()))?;
        Ok(self.shape(tool, input, std::mem::take(selected)))
    }
}

impl Projection {
    /// The one entry of the call path: the result of a raw response kept as compact text,
    /// with the selection the compacting pass found, if any. Cut out of the text when the
    /// selection holds evidence; otherwise (null, empty or unresolved) the tree parsed from
    /// `raw` decides, as [`Projector::project`] would.
    pub fn project_json(
        &self,
        tool: &str,
        input: &Value,
        raw: &str,
        selected: Option<&compact::Selected>,
    ) -> Result<ProjectedJson, ProjectionError> {
        let cut = match selected {
            Some(selected) => self.project_selected(raw, selected),
            None => self.project_text(raw),
        };
        if let Some(json) = cut {
            return Ok(ProjectedJson {
                evidence: Evidence::Found,
                json,
            });
        }
        let tree: Value =
            serde_json::from_str(raw).map_err(|e| ProjectionError::Parse(e.to_string()))?;
        let projected = check(self.project_owned(tool, input, tree)?)?;
        Ok(ProjectedJson {
            evidence: projected.evidence,
            json: projected.result.to_string(),
        })
    }

    /// The agent result as compact JSON, cut straight out of a raw response kept as compact
    /// text (one [`compact::compact`] wrote): the bytes serde_json writes for the result of
    /// [`Projector::project`], whose evidence is then `EVIDENCE_FOUND`. `None` when the
    /// selection is null, empty or unresolved: the tree path decides those.
    pub fn project_text(&self, raw: &str) -> Option<String> {
        let selected = compact::pointer(raw, &self.select)?;
        let items = match selected.as_bytes().first() {
            Some(b'[') => compact::items(selected)?,
            _ => Vec::new(),
        };
        self.shape_text(selected, &items, items.len())
    }

    /// [`Projection::project_text`] with the selection the compacting pass found
    /// ([`compact::compact_selecting`] with this projection's [`compact::Select`]), so
    /// nothing of `raw` is read again but what the result copies.
    pub fn project_selected(&self, raw: &str, selected: &compact::Selected) -> Option<String> {
        let text = raw.get(selected.range.clone())?;
        let items = selected
            .items
            .iter()
            .map(|r| raw.get(r.clone()))
            .collect::<Option<Vec<&str>>>()?;
        self.shape_text(text, &items, selected.total)
    }

    /// The result made of the selected value's text; for an array, `items` holds (at least)
    /// the texts of the items kept, of `total`.
    fn shape_text(&self, selected: &str, items: &[&str], total: usize) -> Option<String> {
        let keys = self.fields.as_deref();
        let mut out = String::with_capacity(selected.len() + 32);
        match selected.as_bytes().first()? {
            b'n' => return None,
            b'[' => {
                if total == 0 {
                    return None;
                }
                let keep = self.max_items.unwrap_or(total).min(total);
                out.push_str("{\"items\":[");
                for (i, item) in items.get(..keep)?.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    keep_fields_text(&mut out, keys, item)?;
                }
                out.push_str("],\"total_items\":");
                out.push_str(&total.to_string());
                out.push('}');
            }
            _ => {
                out.push_str("{\"item\":");
                keep_fields_text(&mut out, keys, selected)?;
                out.push('}');
            }
        }
        Some(out)
    }

    /// The result made of the selected value.
    fn shape(&self, tool: &str, input: &Value, selected: Value) -> Projected {
        match selected {
            Value::Null => no_evidence(tool, input),
            Value::Array(items) if items.is_empty() => no_evidence(tool, input),
            Value::Array(items) => {
                let total = items.len();
                let keep = self.max_items.unwrap_or(total).min(total);
                let kept: Vec<Value> = items
                    .into_iter()
                    .take(keep)
                    .map(|v| self.keep_fields(v))
                    .collect();
                // Built directly: `json!` would deep-copy the items once more.
                let result = Map::from_iter([
                    ("items".to_string(), Value::Array(kept)),
                    ("total_items".to_string(), Value::from(total)),
                ]);
                Projected {
                    evidence: Evidence::Found,
                    result: Value::Object(result),
                }
            }
            other => Projected {
                evidence: Evidence::Found,
                result: Value::Object(Map::from_iter([(
                    "item".to_string(),
                    self.keep_fields(other),
                )])),
            },
        }
    }

    fn keep_fields(&self, v: Value) -> Value {
        match (v, &self.fields) {
            (Value::Object(mut obj), Some(fields)) => {
                let kept: Map<String, Value> = fields
                    .iter()
                    .filter_map(|f| obj.remove(f).map(|v| (f.clone(), v)))
                    .collect();
                Value::Object(kept)
            }
            (v, _) => v,
        }
    }
}

/// [`Projection::keep_fields`] on compact text: `keys` are the fields as JSON strings. A field
/// named twice is kept once, where it was first named, as a map built from the pairs keeps it.
fn keep_fields_text(out: &mut String, keys: Option<&[String]>, value: &str) -> Option<()> {
    let Some(keys) = keys.filter(|_| value.starts_with('{')) else {
        out.push_str(value);
        return Some(());
    };
    let members = compact::members(value)?;
    let mut kept: Vec<&str> = Vec::with_capacity(keys.len());
    out.push('{');
    for key in keys {
        if kept.contains(&key.as_str()) {
            continue;
        }
        if let Some((k, v)) = members.iter().find(|(k, _)| compact::is_key(k, key)) {
            if !kept.is_empty() {
                out.push(',');
            }
            out.push_str(k);
            out.push(':');
            out.push_str(v);
            kept.push(key);
        }
    }
    out.push('}');
    Some(())
}

fn no_evidence(tool: &str, input: &Value) -> Projected {
    Projected {
        evidence: Evidence::None,
        result: json!({"scope": {"tool": tool, "input": input}}),
    }
}

/// Checks what any projector returned: an agent result is never an ERROR.
pub fn check(projected: Projected) -> Result<Projected, ProjectionError> {
    match projected.evidence {
        Evidence::Found | Evidence::None => Ok(projected),
        Evidence::Error => Err(ProjectionError::BadEvidence(Evidence::Error.as_str())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn search() -> Projection {
        Projection {
            select: "/results".into(),
            max_items: Some(2),
            fields: Some(vec!["title".into(), "url".into()]),
        }
    }

    #[test]
    fn array_keeps_first_items_and_fields() {
        let raw = json!({"results": [
            {"title": "a", "url": "u1", "secret": 1},
            {"title": "b", "url": "u2", "secret": 2},
            {"title": "c", "url": "u3", "secret": 3},
        ]});
        let p = search()
            .project("search", &json!({"q": "x"}), &raw)
            .unwrap();
        assert_eq!(p.evidence, Evidence::Found);
        assert_eq!(
            p.result,
            json!({"items": [{"title": "a", "url": "u1"}, {"title": "b", "url": "u2"}], "total_items": 3})
        );
    }

    #[test]
    fn object_and_scalar_become_item() {
        let p = search()
            .project("s", &json!({}), &json!({"results": {"title": "t", "x": 1}}))
            .unwrap();
        assert_eq!(p.result, json!({"item": {"title": "t"}}));
        let p = search()
            .project("s", &json!({}), &json!({"results": 7}))
            .unwrap();
        assert_eq!(
            (p.evidence, p.result),
            (Evidence::Found, json!({"item": 7}))
        );
    }

    #[test]
    fn null_and_empty_are_scoped_no_evidence() {
        let input = json!({"q": "nothing"});
        for raw in [json!({"results": []}), json!({"results": null})] {
            let p = search().project("search", &input, &raw).unwrap();
            assert_eq!(p.evidence, Evidence::None);
            assert_eq!(
                p.result,
                json!({"scope": {"tool": "search", "input": {"q": "nothing"}}})
            );
        }
    }

    #[test]
    fn unresolved_pointer_fails() {
        let e = search()
            .project("s", &json!({}), &json!({"other": 1}))
            .unwrap_err();
        assert_eq!(e, ProjectionError::Unresolved("/results".into()));
    }

    #[test]
    fn default_projection_is_whole_document() {
        let raw = json!({"a": [1, 2]});
        let p = Projection::default()
            .project("t", &json!({}), &raw)
            .unwrap();
        assert_eq!(p.result, json!({"item": {"a": [1, 2]}}));
        let p = Projection::default()
            .project("t", &json!({}), &json!([1, 2, 3]))
            .unwrap();
        assert_eq!(p.result, json!({"items": [1, 2, 3], "total_items": 3}));
    }

    #[test]
    fn owned_and_borrowed_projections_agree() {
        let fields = Projection {
            fields: Some(vec!["title".into(), "title".into(), "none".into()]),
            ..search()
        };
        let raws = [
            json!({"results": [{"title": "a", "url": "u"}, {"url": "v"}, 3, {"title": "c"}]}),
            json!({"results": {"title": "t", "x": 1}}),
            json!({"results": []}),
            json!({"results": null}),
            json!({"results": "s"}),
            json!({"other": 1}),
        ];
        for projection in [search(), fields, Projection::default()] {
            for raw in &raws {
                let input = json!({"q": 1});
                assert_eq!(
                    projection.project("t", &input, raw),
                    projection.project_owned("t", &input, raw.clone()),
                    "{raw}"
                );
            }
        }
    }

    #[test]
    fn text_projection_writes_what_the_tree_projection_serializes_to() {
        let fields = |f: &[&str]| Some(f.iter().map(|s| s.to_string()).collect());
        let projections = [
            search(),
            Projection::default(),
            Projection {
                fields: fields(&["title", "title", "none", "é\"k"]),
                ..search()
            },
            Projection {
                select: "/results/1".into(),
                max_items: Some(0),
                fields: fields(&["url"]),
            },
            Projection {
                select: "/a~1b/0".into(),
                ..Projection::default()
            },
            Projection {
                max_items: Some(2),
                ..search()
            },
            Projection {
                select: "/results".into(),
                max_items: Some(9),
                fields: fields(&["url", "title"]),
            },
        ];
        let raws = [
            r#"{"results":[{"title":"a","url":"u","é\"k":1},{"url":"v"},3,{"title":"c"}]}"#,
            r#"{"results":{"title":"t","x":[1,{"y":"}"}]}}"#,
            r#"{"results":[]}"#,
            r#"{"results":null}"#,
            r#"{"results":"s,]}"}"#,
            r#"{"other":1,"a/b":[{"z":1}]}"#,
            r#"[1,[2],{"3":4}]"#,
            "7",
        ];
        let input = json!({"q": 1});
        for projection in &projections {
            for raw in raws {
                let compact = compact::compact(raw.as_bytes()).unwrap().json;
                let tree: Value = serde_json::from_str(raw).unwrap();
                let by_tree = projection.project("t", &input, &tree);
                // What the compacting pass found gives the same text as searching it.
                let plan = projection.plan().unwrap();
                let pass = compact::compact_selecting(raw.as_bytes(), Some(&plan)).unwrap();
                assert_eq!(pass.json, compact);
                let from_pass = pass
                    .selected
                    .as_ref()
                    .and_then(|s| projection.project_selected(&pass.json, s));
                assert_eq!(
                    from_pass,
                    projection.project_text(&compact),
                    "{raw} {projection:?}"
                );
                // The call path's one entry gives what the tree projection gives, from the
                // pass's selection and from text serde_json wrote (an MCP result).
                let expected = by_tree.clone().and_then(check).map(|p| ProjectedJson {
                    evidence: p.evidence,
                    json: p.result.to_string(),
                });
                let serialized = tree.to_string();
                for (text, selected) in [
                    (&pass.json, pass.selected.as_ref()),
                    (&compact, None),
                    (&serialized, None),
                ] {
                    assert_eq!(
                        projection.project_json("t", &input, text, selected).ok(),
                        expected.clone().ok(),
                        "{raw} {projection:?}"
                    );
                }
                match projection.project_text(&compact) {
                    Some(text) => {
                        let p = by_tree.unwrap();
                        assert_eq!(p.evidence, Evidence::Found);
                        assert_eq!(text, serde_json::to_string(&p.result).unwrap(), "{raw}");
                    }
                    None => assert!(
                        by_tree.map_or(true, |p| p.evidence == Evidence::None),
                        "{raw} {projection:?}"
                    ),
                }
            }
        }
    }

    #[test]
    fn an_error_evidence_from_a_projector_is_refused() {
        let bad = Projected {
            evidence: Evidence::Error,
            result: json!({}),
        };
        assert!(check(bad).is_err());
    }
}
