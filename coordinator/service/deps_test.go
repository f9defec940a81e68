package service_test

import (
	"os/exec"
	"strings"
	"testing"
)

// TestNoTensorMath: the coordinator's core logic (this package, the job
// lifecycle, the router, the model info, the client) does not pull in the
// kernels or the model's math; only the in-process cluster and the demo
// do, to run workers.
func TestNoTensorMath(t *testing.T) {
	const mod = "github.com/tandem-inference/tandem/"
	pkgs := []string{"coordinator/service", "coordinator/jobs", "coordinator/router", "coordinator/modelinfo",
		"coordinator/client", "coordinator/metrics", "coordinator/membership"}
	args := []string{"list", "-deps"}
	for _, p := range pkgs {
		args = append(args, mod+p)
	}
	out, err := exec.Command("go", args...).CombinedOutput()
	if err != nil {
		t.Skipf("go list: %v\n%s", err, out)
	}
	for _, dep := range strings.Fields(string(out)) {
		for _, banned := range []string{mod + "kernels", mod + "model"} {
			if dep == banned || strings.HasPrefix(dep, banned+"/") {
				t.Errorf("the coordinator's core imports %s", dep)
			}
		}
	}
}
