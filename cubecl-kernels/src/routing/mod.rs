pub mod token_routing;
