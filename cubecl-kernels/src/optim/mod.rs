pub mod adamw;
pub mod sum_squares;
