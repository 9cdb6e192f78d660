pub mod protocol;
pub mod verbs;
