//! weft-gang: whole jobs placed as one decision (docs/gang.md).
