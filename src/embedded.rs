//! Files the binary carries: the demo model (a tiny model of the first family), whose tokenizer
//! and scheduler config are its real model's own, so a model made from component files alone
//! gets them here.

include!(concat!(env!("OUT_DIR"), "/demo_files.rs"));
