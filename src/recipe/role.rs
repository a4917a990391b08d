//! `QuantizerRole` and the quantizer slots of each module, exactly as TE assigns them (spec
//! section 6): forward slots `[input, weight, output]` per GEMM, backward `[grad_output,
//! grad_input]` per GEMM, with boundary slots (a module's output and grad_input) whose role a
//! parent module may set and which are otherwise unset (`None`).

use serde::{Deserialize, Serialize};

/// Canonical tensor types.
pub const INPUT: &str = "input";
pub const WEIGHT: &str = "weight";
pub const OUTPUT: &str = "output";
pub const GRAD_OUTPUT: &str = "grad_output";
pub const GRAD_INPUT: &str = "grad_input";

/// The module types of TE's roles and the tensor types each gives its slots: burn-lowp's
/// `Linear`, `LayerNormLinear` and `LayerNormMlp` are `linear`, `GroupedLinear` is
/// `grouped_linear`; `dpa` (attention) roles reach a module only as a parent's boundary role.
pub const MODULE_TYPES: [(&str, &[&str]); 3] = [
    ("linear", &[INPUT, WEIGHT, OUTPUT, GRAD_OUTPUT, GRAD_INPUT]),
    ("grouped_linear", &[INPUT, WEIGHT, OUTPUT, GRAD_OUTPUT, GRAD_INPUT]),
    ("dpa", &["qkv", "s", "do", "dp"]),
];

/// Who a quantizer slot serves: the module type (`linear`, `grouped_linear`), the tensor type
/// (`input`, `weight`, `output`, `grad_output`, `grad_input`) and the module's name.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
pub struct QuantizerRole {
    #[serde(default)]
    pub module_type: String,
    #[serde(default)]
    pub tensor_type: String,
    #[serde(default)]
    pub name: String,
}

impl QuantizerRole {
    pub fn new(module_type: &str, tensor_type: &str, name: &str) -> Self {
        QuantizerRole {
            module_type: module_type.to_string(),
            tensor_type: tensor_type.to_string(),
            name: name.to_string(),
        }
    }
}

impl std::fmt::Display for QuantizerRole {
    /// The set fields joined with `|`, as TE prints roles.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let parts: Vec<&str> = [&self.module_type, &self.tensor_type, &self.name]
            .into_iter()
            .map(String::as_str)
            .filter(|s| !s.is_empty())
            .collect();
        write!(f, "{}", parts.join("|"))
    }
}

/// Forward or backward slots.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Pass {
    Forward,
    Backward,
}

/// The tensor type a slot stands for, for recipes that dispatch on it: the role's own when it is
/// canonical, else TE's positional fallback (`[input, weight, output][i % 3]` forward,
/// `[grad_output, grad_input][i % 2]` backward).
pub fn slot_tensor_type(role: Option<&QuantizerRole>, pass: Pass, index: usize) -> &str {
    if let Some(role) = role {
        if [INPUT, WEIGHT, OUTPUT, GRAD_OUTPUT, GRAD_INPUT].contains(&role.tensor_type.as_str()) {
            return &role.tensor_type;
        }
    }
    match pass {
        Pass::Forward => [INPUT, WEIGHT, OUTPUT][index % 3],
        Pass::Backward => [GRAD_OUTPUT, GRAD_INPUT][index % 2],
    }
}

/// The modules with quantizer slots.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum ModuleKind {
    Linear,
    LayerNormLinear,
    LayerNormMlp,
    GroupedLinear { num_gemms: usize },
}

/// Roles a parent gives a module's boundary slots (TE `_output_quantizer_role`,
/// `_grad_input_quantizer_role`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct BoundaryRoles {
    pub output: Option<QuantizerRole>,
    pub grad_input: Option<QuantizerRole>,
}

/// The roles of every slot of one module instance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotLayout {
    pub kind: ModuleKind,
    pub name: String,
    pub forward: Vec<Option<QuantizerRole>>,
    pub backward: Vec<Option<QuantizerRole>>,
}

impl SlotLayout {
    /// The slots TE gives module `kind` named `name`.
    pub fn new(kind: ModuleKind, name: &str, boundary: &BoundaryRoles) -> SlotLayout {
        let linear =
            |tensor_type: &str, name: &str| Some(QuantizerRole::new("linear", tensor_type, name));
        let (forward, backward) = match kind {
            ModuleKind::Linear | ModuleKind::LayerNormLinear => (
                vec![
                    linear(INPUT, name),
                    linear(WEIGHT, name),
                    boundary.output.clone(),
                ],
                vec![linear(GRAD_OUTPUT, name), boundary.grad_input.clone()],
            ),
            ModuleKind::LayerNormMlp => {
                let (fc1, fc2) = if name.is_empty() {
                    ("fc1".to_string(), "fc2".to_string())
                } else {
                    (format!("{name}.fc1"), format!("{name}.fc2"))
                };
                (
                    vec![
                        linear(INPUT, &fc1),
                        linear(WEIGHT, &fc1),
                        // fc1's output is labelled by its consumer, fc2.
                        linear(INPUT, &fc2),
                        linear(INPUT, &fc2),
                        linear(WEIGHT, &fc2),
                        boundary.output.clone(),
                    ],
                    vec![
                        linear(GRAD_OUTPUT, &fc1),
                        boundary.grad_input.clone(),
                        linear(GRAD_OUTPUT, &fc2),
                        // fc2's grad_input is the gradient flowing into fc1.
                        linear(GRAD_OUTPUT, &fc1),
                    ],
                )
            }
            ModuleKind::GroupedLinear { num_gemms } => {
                let grouped = |tensor_type: &str| {
                    Some(QuantizerRole::new("grouped_linear", tensor_type, name))
                };
                let mut forward = Vec::with_capacity(3 * num_gemms);
                let mut backward = Vec::with_capacity(2 * num_gemms);
                for _ in 0..num_gemms {
                    forward.extend([grouped(INPUT), grouped(WEIGHT), boundary.output.clone()]);
                    backward.extend([grouped(GRAD_OUTPUT), boundary.grad_input.clone()]);
                }
                (forward, backward)
            }
        };
        SlotLayout {
            kind,
            name: name.to_string(),
            forward,
            backward,
        }
    }
}
