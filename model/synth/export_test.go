package synth

var LogPortable = logPortable
