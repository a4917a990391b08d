//! Reading recipe JSON with errors that name the JSON path of the offending field
//! (`rules[2].quantizer.rowwise.format: unknown variant ...`). Serde loses the path inside
//! internally tagged enums (it buffers their content), so quantizers and custom rules are taken
//! apart here, each piece deserialized with its own path.

use serde::de::DeserializeOwned;
use serde_json::Value;

use super::custom::{CustomRecipe, CustomRule, RolePattern};
use super::recipe::Recipe;
use crate::error::{LowpError, Result};
use crate::quant::QuantizerSpec;

fn from_value<T: DeserializeOwned>(value: &Value, path: &str) -> Result<T> {
    let mut tracked = serde_path_to_error::Track::new();
    let de = serde_path_to_error::Deserializer::new(value, &mut tracked);
    T::deserialize(de).map_err(|e| {
        let inner = tracked.path().to_string();
        let full = match (path.is_empty(), inner == ".") {
            (true, true) => "recipe".to_string(),
            (true, false) => inner,
            (false, true) => path.to_string(),
            (false, false) => format!("{path}.{inner}"),
        };
        LowpError::invalid(full, "JSON", e.to_string())
    })
}

/// An object's fields, refusing any not in `allowed`.
fn object<'a>(
    value: &'a Value,
    path: &str,
    allowed: &[&str],
) -> Result<&'a serde_json::Map<String, Value>> {
    let map = value
        .as_object()
        .ok_or_else(|| LowpError::invalid(path, value, "expected a JSON object"))?;
    if let Some(key) = map.keys().find(|k| !allowed.contains(&k.as_str())) {
        return Err(LowpError::invalid(
            path,
            "JSON",
            format!(
                "unknown field `{key}`, expected one of {}",
                allowed.join(", ")
            ),
        ));
    }
    Ok(map)
}

/// A quantizer at `path`; hybrids are taken apart so their sides keep their paths.
pub fn quantizer(value: &Value, path: &str) -> Result<QuantizerSpec> {
    if value.get("format").and_then(Value::as_str) != Some("hybrid") {
        return from_value(value, path);
    }
    let map = object(
        value,
        path,
        &["format", "rowwise", "columnwise", "columnwise_source"],
    )?;
    let side = |name: &str| -> Result<Box<QuantizerSpec>> {
        let v = map
            .get(name)
            .ok_or_else(|| LowpError::invalid(path, "JSON", format!("missing field `{name}`")))?;
        Ok(Box::new(quantizer(v, &format!("{path}.{name}"))?))
    };
    Ok(QuantizerSpec::Hybrid {
        rowwise: side("rowwise")?,
        columnwise: side("columnwise")?,
        columnwise_source: match map.get("columnwise_source") {
            Some(v) => from_value(v, &format!("{path}.columnwise_source"))?,
            None => Default::default(),
        },
    })
}

/// A recipe document.
pub fn recipe(text: &str) -> Result<Recipe> {
    let value: Value = serde_json::from_str(text)
        .map_err(|e| LowpError::invalid("recipe", "JSON", e.to_string()))?;
    let name = value.get("recipe").ok_or_else(|| {
        LowpError::invalid(
            "recipe",
            "JSON",
            "missing field `recipe` (the recipe's name)",
        )
    })?;
    // The built-in recipes' fields, deserialized without the tag so that their paths survive.
    let mut fields = value.clone();
    if let Some(map) = fields.as_object_mut() {
        map.remove("recipe");
    }
    let recipe = match name.as_str() {
        Some("delayed_scaling") => Recipe::DelayedScaling(from_value(&fields, "")?),
        Some("current_scaling") => Recipe::CurrentScaling(from_value(&fields, "")?),
        Some("block_scaling") => Recipe::BlockScaling(from_value(&fields, "")?),
        Some("mxfp8") => Recipe::Mxfp8(from_value(&fields, "")?),
        Some("nvfp4") => Recipe::Nvfp4(from_value(&fields, "")?),
        Some("bf16") => {
            object(&value, "recipe", &["recipe"])?;
            Recipe::Bf16
        }
        Some("custom") => custom(&value)?,
        _ => {
            return Err(LowpError::invalid(
                "recipe",
                name,
                "unknown recipe: expected delayed_scaling, current_scaling, block_scaling, mxfp8, nvfp4, bf16 or custom",
            ))
        }
    };
    Ok(recipe)
}

fn custom(value: &Value) -> Result<Recipe> {
    let map = object(value, "recipe", &["recipe", "rules", "default", "allow_unmatched_rules"])?;
    let rules = match map.get("rules") {
        None => Vec::new(),
        Some(rules) => rules
            .as_array()
            .ok_or_else(|| LowpError::invalid("rules", rules, "expected a JSON array of rules"))?
            .iter()
            .enumerate()
            .map(|(i, rule)| {
                let path = format!("rules[{i}]");
                let fields = object(rule, &path, &["match", "quantizer"])?;
                let pattern: RolePattern = match fields.get("match") {
                    Some(m) => from_value(m, &format!("{path}.match"))?,
                    None => RolePattern::default(),
                };
                let spec = fields.get("quantizer").ok_or_else(|| {
                    LowpError::invalid(&path, "JSON", "missing field `quantizer`")
                })?;
                Ok(CustomRule {
                    pattern,
                    quantizer: quantizer(spec, &format!("{path}.quantizer"))?,
                })
            })
            .collect::<Result<Vec<_>>>()?,
    };
    let default = map.get("default").ok_or_else(|| {
        LowpError::invalid(
            "recipe",
            "JSON",
            "missing field `default` (the quantizer of roles no rule matches)",
        )
    })?;
    let allow_unmatched_rules = match map.get("allow_unmatched_rules") {
        None => false,
        Some(flag) => flag.as_bool().ok_or_else(|| {
            LowpError::invalid("allow_unmatched_rules", flag, "expected a boolean")
        })?,
    };
    Ok(Recipe::Custom(CustomRecipe {
        rules,
        default: quantizer(default, "default")?,
        allow_unmatched_rules,
    }))
}
