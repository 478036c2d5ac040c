//! Files the binary carries: the demo model (a tiny Z-Image), whose tokenizer and scheduler
//! config are Z-Image-Turbo's own, so a model made from component files alone gets them here.

include!(concat!(env!("OUT_DIR"), "/demo_files.rs"));
