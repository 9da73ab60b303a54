fn main() {
    eprintln!("loglinear_scaling: not written yet");
}
