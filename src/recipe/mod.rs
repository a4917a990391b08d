//! Recipes: which quantizer every slot of every module gets. Roles and slot layouts
//! (`role.rs`), the recipe file format with TE's built-in recipes (`recipe.rs`) and custom rules
//! (`custom.rs`), how FP8 GEMMs accumulate (`gemm_params.rs`), and what a recipe assigned in a
//! built model (`audit.rs`).

pub mod audit;
pub mod custom;
pub mod gemm_params;
pub mod json;
pub mod recipe;
pub mod role;

pub use audit::RecipeAudit;
pub use custom::{CustomRecipe, CustomRule, RolePattern};
pub use gemm_params::{MmParams, SplitAccumulator};
pub use recipe::{
    resolve_slots, BlockScalingRecipe, CurrentScalingRecipe, GemmSlots, ModuleQuantizers,
    Mxfp8Recipe, Nvfp4Recipe, Recipe, SlotQuantizer,
};
pub use role::{BoundaryRoles, ModuleKind, Pass, QuantizerRole, SlotLayout};
