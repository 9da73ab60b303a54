fn main() {
    eprintln!("glr_scaling: not written yet");
}
