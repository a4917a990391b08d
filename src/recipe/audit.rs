//! What a recipe did to a built model: the quantizer every slot of every module got, listed
//! compactly (one line per distinct assignment), and the custom rules that matched no slot at
//! all. A rule that matches nothing is almost always a typo in a name glob (`layers.99.*` in an
//! 8-layer model): the run would silently train the default quantizer there, so it is an error
//! unless the recipe sets `allow_unmatched_rules`.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use super::recipe::{ModuleQuantizers, Recipe};
use super::role::SlotLayout;
use crate::error::{LowpError, Result};

/// One module's resolved slots, as its `LowpState` holds them.
pub type ModuleSlots<'a> = (&'a SlotLayout, &'a ModuleQuantizers);

/// The audit of one recipe over one model.
#[derive(Debug, Clone, PartialEq)]
pub struct RecipeAudit {
    /// One line per distinct (module type, slot tensor type, quantizer), with the modules.
    pub lines: Vec<AssignmentLine>,
    /// Indices of custom rules that match no slot (empty for built-in recipes).
    pub unmatched_rules: Vec<usize>,
    /// Slots counted over all modules (a grouped module's experts count once).
    pub slots: usize,
    pub modules: usize,
}

#[derive(Debug, Clone, PartialEq)]
pub struct AssignmentLine {
    /// The slots' module type (`linear`, `grouped_linear`), or `-` for unset boundary roles.
    pub module_type: String,
    /// `forward` or `backward`.
    pub pass: &'static str,
    /// The slot's tensor type (`input`, `weight`, ...; TE's positional type for unset roles).
    pub tensor_type: String,
    /// `QuantizerSpec::name`.
    pub quantizer: String,
    /// Module names, in model order.
    pub names: Vec<String>,
}

impl RecipeAudit {
    /// Audits `recipe` over `modules` (every quantized module of a model). Errors when a custom
    /// rule matches no slot, unless the recipe allows it (then the rule is in `unmatched_rules`).
    pub fn new(recipe: &Recipe, modules: &[ModuleSlots<'_>]) -> Result<RecipeAudit> {
        let mut lines: BTreeMap<(String, &'static str, String, String), (usize, Vec<String>)> = BTreeMap::new();
        let mut slots = 0;
        for (order, (layout, quantizers)) in modules.iter().enumerate() {
            let passes = [
                ("forward", &layout.forward, &quantizers.forward),
                ("backward", &layout.backward, &quantizers.backward),
            ];
            for (pass, roles, resolved) in passes {
                for (role, slot) in roles.iter().zip(resolved.iter()) {
                    let module_type = role.as_ref().map(|r| r.module_type.clone()).unwrap_or_else(|| "-".into());
                    let key = (module_type, pass, slot.tensor_type.clone(), slot.spec.name());
                    let entry = lines.entry(key).or_insert((order, Vec::new()));
                    if entry.1.last() != Some(&layout.name) {
                        entry.1.push(layout.name.clone());
                        slots += 1;
                    }
                }
            }
        }
        // Lines in model order of their first module, forward before backward.
        let mut ordered: Vec<_> = lines.into_iter().collect();
        ordered.sort_by_key(|((_, pass, tensor_type, _), (order, _))| (*order, *pass != "forward", tensor_type.clone()));
        let lines = ordered
            .into_iter()
            .map(|((module_type, pass, tensor_type, quantizer), (_, names))| AssignmentLine {
                module_type,
                pass,
                tensor_type,
                quantizer,
                names,
            })
            .collect();

        let mut unmatched_rules = Vec::new();
        if let Recipe::Custom(custom) = recipe {
            for (i, rule) in custom.rules.iter().enumerate() {
                let matched = modules.iter().any(|(layout, _)| {
                    layout.forward.iter().chain(&layout.backward).any(|role| rule.pattern.matches(role.as_ref()))
                });
                if matched {
                    continue;
                }
                if !custom.allow_unmatched_rules {
                    let pattern = serde_json::to_string(&rule.pattern).unwrap_or_default();
                    return Err(LowpError::invalid(
                        format!("rules[{i}].match"),
                        pattern,
                        format!(
                            "matches no quantizer slot of the model's {} modules (a misspelt name glob?); \
                             set \"allow_unmatched_rules\": true in the recipe to accept it",
                            modules.len()
                        ),
                    ));
                }
                unmatched_rules.push(i);
            }
        }
        Ok(RecipeAudit { lines, unmatched_rules, slots, modules: modules.len() })
    }

    /// Warnings the run should print: the rules allowed to match nothing.
    pub fn warnings(&self) -> Vec<String> {
        self.unmatched_rules
            .iter()
            .map(|i| format!("recipe rule rules[{i}] matches no quantizer slot of the model"))
            .collect()
    }

    /// The listing: a header, then one line per distinct assignment, module names compressed
    /// (`layers.[0-7].attention.qkv`).
    pub fn listing(&self) -> String {
        let mut out = format!("quantizers: {} slots in {} modules\n", self.slots, self.modules);
        for line in &self.lines {
            let _ = writeln!(
                out,
                "  {:<8} {:<14} {:<11} {:<32} {}",
                line.pass,
                line.module_type,
                line.tensor_type,
                line.quantizer,
                compress_names(&line.names)
            );
        }
        for warning in self.warnings() {
            let _ = writeln!(out, "  warning: {warning}");
        }
        out
    }
}

/// Names with their digit runs replaced by `#` (the name's shape) and the digit runs.
fn shape_of(name: &str) -> (String, Vec<u64>) {
    let (mut shape, mut numbers, mut digits) = (String::new(), Vec::new(), String::new());
    for c in name.chars().chain(std::iter::once('\0')) {
        if c.is_ascii_digit() {
            digits.push(c);
            continue;
        }
        if !digits.is_empty() {
            numbers.push(digits.parse().unwrap_or(u64::MAX));
            shape.push('#');
            digits.clear();
        }
        if c != '\0' {
            shape.push(c);
        }
    }
    (shape, numbers)
}

/// `layers.0.attention.qkv, layers.1.attention.qkv, ...` -> `layers.[0-7].attention.qkv`: names
/// of one shape that differ in one number are written with that number's values as ranges;
/// anything else is listed as it is.
pub fn compress_names(names: &[String]) -> String {
    let mut groups: Vec<(String, Vec<Vec<u64>>, Vec<&String>)> = Vec::new();
    for name in names {
        let (shape, numbers) = shape_of(name);
        match groups.iter_mut().find(|(s, _, _)| *s == shape) {
            Some(group) => {
                group.1.push(numbers);
                group.2.push(name);
            }
            None => groups.push((shape, vec![numbers], vec![name])),
        }
    }
    let mut parts = Vec::new();
    for (shape, numbers, originals) in groups {
        let width = numbers[0].len();
        let varying: Vec<usize> = (0..width).filter(|&k| numbers.iter().any(|n| n[k] != numbers[0][k])).collect();
        if numbers.len() == 1 || varying.len() != 1 {
            parts.extend(originals.iter().map(|n| n.to_string()));
            continue;
        }
        let k = varying[0];
        let mut values: Vec<u64> = numbers.iter().map(|n| n[k]).collect();
        values.sort_unstable();
        values.dedup();
        let mut ranges = Vec::new();
        let mut start = 0;
        for i in 1..=values.len() {
            if i == values.len() || values[i] != values[i - 1] + 1 {
                ranges.push(match i - start {
                    1 => values[start].to_string(),
                    _ => format!("{}-{}", values[start], values[i - 1]),
                });
                start = i;
            }
        }
        let mut out = String::new();
        let mut index = 0;
        for c in shape.chars() {
            if c != '#' {
                out.push(c);
                continue;
            }
            match index == k {
                true => {
                    let _ = write!(out, "[{}]", ranges.join(","));
                }
                false => {
                    let _ = write!(out, "{}", numbers[0][index]);
                }
            }
            index += 1;
        }
        parts.push(out);
    }
    parts.join(", ")
}

#[cfg(test)]
mod tests {
    use super::compress_names;

    #[test]
    fn names_compress_to_ranges_of_one_number() {
        let names: Vec<String> = (0..8).map(|i| format!("layers.{i}.attention.qkv")).collect();
        assert_eq!(compress_names(&names), "layers.[0-7].attention.qkv");
        let names: Vec<String> = [0, 1, 2, 5, 7].iter().map(|i| format!("layers.{i}.moe.experts.fc1")).collect();
        assert_eq!(compress_names(&names), "layers.[0-2,5,7].moe.experts.fc1");
        let names = vec!["lm_head".to_string()];
        assert_eq!(compress_names(&names), "lm_head");
        // Two numbers varying: listed as they are.
        let names = vec!["a.0.b.1".to_string(), "a.1.b.0".to_string(), "fc1".to_string()];
        assert_eq!(compress_names(&names), "a.0.b.1, a.1.b.0, fc1");
    }
}
