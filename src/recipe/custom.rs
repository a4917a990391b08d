//! Custom recipes: an ordered list of rules, each a role pattern mapped to a quantizer, first
//! match wins, and a required default (TE's `CustomRecipe` with a quantizer factory, written as
//! data).

use serde::{Deserialize, Serialize};

use super::role::{QuantizerRole, MODULE_TYPES};
use crate::error::{LowpError, Result};
use crate::quant::QuantizerSpec;

/// Which roles a rule applies to: every given field must match (`name` is a glob: `*`, `?`,
/// `[...]`); omitted fields match anything. A pattern with no fields also matches unset boundary
/// roles; any field requires a role.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RolePattern {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub module_type: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tensor_type: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

impl RolePattern {
    pub fn is_empty(&self) -> bool {
        self.module_type.is_none() && self.tensor_type.is_none() && self.name.is_none()
    }

    /// Whether the pattern matches `role` (the name glob must already be valid).
    pub fn matches(&self, role: Option<&QuantizerRole>) -> bool {
        let Some(role) = role else {
            return self.is_empty();
        };
        let field = |want: &Option<String>, have: &str| want.as_deref().is_none_or(|w| w == have);
        field(&self.module_type, &role.module_type)
            && field(&self.tensor_type, &role.tensor_type)
            && self
                .name
                .as_deref()
                .is_none_or(|glob| glob::Pattern::new(glob).is_ok_and(|p| p.matches(&role.name)))
    }

    /// Checks the glob and that the module and tensor types are ones modules give their slots
    /// (TE's vocabulary, `role::MODULE_TYPES`): a misspelt type would match nothing and leave the
    /// rule silently unused.
    pub fn validate(&self, path: &str) -> Result<()> {
        let known = |module_type: &str| MODULE_TYPES.iter().find(|(m, _)| *m == module_type);
        if let Some(module_type) = &self.module_type {
            if known(module_type).is_none() {
                let names: Vec<&str> = MODULE_TYPES.iter().map(|(m, _)| *m).collect();
                return Err(LowpError::invalid(
                    format!("{path}.module_type"),
                    format!("{module_type:?}"),
                    format!("no module has this type; module types are {}", names.join(", ")),
                ));
            }
        }
        if let Some(tensor_type) = &self.tensor_type {
            let allowed: Vec<&str> = match self.module_type.as_deref().and_then(known) {
                Some((_, types)) => types.to_vec(),
                None => {
                    let mut all: Vec<&str> = MODULE_TYPES.iter().flat_map(|(_, t)| t.iter().copied()).collect();
                    all.dedup();
                    all
                }
            };
            if !allowed.contains(&tensor_type.as_str()) {
                let owner = match &self.module_type {
                    Some(m) => format!("a `{m}` module"),
                    None => "any module".to_string(),
                };
                return Err(LowpError::invalid(
                    format!("{path}.tensor_type"),
                    format!("{tensor_type:?}"),
                    format!("no slot of {owner} has this tensor type; tensor types are {}", allowed.join(", ")),
                ));
            }
        }
        if let Some(name) = &self.name {
            glob::Pattern::new(name).map_err(|e| {
                LowpError::invalid(
                    format!("{path}.name"),
                    name,
                    format!("not a valid glob: {e}"),
                )
            })?;
        }
        Ok(())
    }
}

/// One rule: roles matching `match` get `quantizer`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CustomRule {
    #[serde(rename = "match", default)]
    pub pattern: RolePattern,
    pub quantizer: QuantizerSpec,
}

/// Rules in order, then the default.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CustomRecipe {
    #[serde(default)]
    pub rules: Vec<CustomRule>,
    pub default: QuantizerSpec,
    /// A rule that matches no slot of the model it builds is an error (`recipe::audit`) unless
    /// this is set; then it is a warning.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub allow_unmatched_rules: bool,
}

impl CustomRecipe {
    /// The quantizer of the first rule matching `role`, else the default.
    pub fn quantizer(&self, role: Option<&QuantizerRole>) -> &QuantizerSpec {
        self.rules
            .iter()
            .find(|rule| rule.pattern.matches(role))
            .map(|rule| &rule.quantizer)
            .unwrap_or(&self.default)
    }

    /// Checks every rule (JSON paths `rules[i]...`, `default`); returns warnings.
    pub fn validate(&self) -> Result<Vec<String>> {
        let mut warnings = Vec::new();
        for (i, rule) in self.rules.iter().enumerate() {
            rule.pattern.validate(&format!("rules[{i}].match"))?;
            rule.quantizer.validate(&format!("rules[{i}].quantizer"))?;
            if let Some(tensor_type) = &rule.pattern.tensor_type {
                if rule.quantizer.uses_stochastic_rounding() && !tensor_type.starts_with("grad") {
                    warnings.push(format!(
                        "rules[{i}]: NVFP4 stochastic rounding on tensor type `{tensor_type}`; TE applies it to gradients only"
                    ));
                }
            }
        }
        self.default.validate("default")?;
        Ok(warnings)
    }
}
