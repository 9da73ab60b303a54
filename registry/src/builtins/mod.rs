//! The builtin patterns, masks and λ schemes, registered through the same `#[register]`
//! attribute a plugin uses, and the builtin mixers' constructors.

/// Registers the builtin mixers of one family that share its constructor: one
/// `#[register]`ed [`MixerEntry`](crate::entries::MixerEntry) per `STATIC = "name", "doc",
/// [examples…];`, each with the family key and `build` given once.
macro_rules! mixer_entries {
    (
        family: $family:literal, build: $build:path;
        $($id:ident = $name:literal, $doc:literal, [$($example:literal),* $(,)?];)+
    ) => {
        $(
            #[crate::register]
            static $id: crate::entries::MixerEntry = crate::entries::MixerEntry {
                name: $name,
                family: $family,
                doc: $doc,
                build: $build,
                examples: &[$($example),*],
            };
        )+
    };
}
use mixer_entries;

mod attention;
mod glr;
mod lambdas;
mod loglinear;
mod masks;
mod patterns;
mod toeplitz;
