package modelinfo

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/tandem-inference/tandem/internal/modelconfig"
	"github.com/tandem-inference/tandem/model/safetensors"
)

// idDigest is how many bytes of each SHA-256 an identity shows: 12 hex
// digits, enough to tell a deployment's checkpoints apart and short enough
// to read in `coordinator workers`.
const idDigest = 6

// CanonicalConfig is the canonical form of a parsed configuration, which
// the config digest of an identity hashes: the fields of
// internal/modelconfig.Config with the parser's defaults filled in, as JSON
// with sorted keys and numbers as Go formats them, so that 1e-05 and
// 0.00001 are one number. The vision tower's config is left out, since
// tandem runs the text tower only.
func CanonicalConfig(c *modelconfig.Config) ([]byte, error) {
	b, err := json.Marshal(c)
	if err != nil {
		return nil, fmt.Errorf("model identity: %w", err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("model identity: %w", err)
	}
	delete(m, "vision_config")
	// encoding/json writes map keys sorted, at every level.
	out, err := json.Marshal(m)
	if err != nil {
		return nil, fmt.Errorf("model identity: %w", err)
	}
	return out, nil
}

// TensorMeta is what the identity takes of one tensor.
type TensorMeta struct {
	Name  string
	DType string
	Shape []int64
}

// identityOf is the identity of a configuration's canonical form and its
// checkpoint's tensors (nil: config only). It is pure: the order of
// tensors does not matter.
func identityOf(canonical []byte, tensors []TensorMeta) string {
	cs := sha256.Sum256(canonical)
	id := "m-" + hex.EncodeToString(cs[:idDigest])
	if tensors == nil {
		return id
	}
	ts := slices.Clone(tensors)
	slices.SortFunc(ts, func(a, b TensorMeta) int { return strings.Compare(a.Name, b.Name) })
	h := sha256.New()
	var line bytes.Buffer
	for _, t := range ts {
		line.Reset()
		line.WriteString(t.Name)
		line.WriteByte('\t')
		line.WriteString(t.DType)
		line.WriteByte('\t')
		for i, d := range t.Shape {
			if i > 0 {
				line.WriteByte(',')
			}
			line.WriteString(strconv.FormatInt(d, 10))
		}
		line.WriteByte('\n')
		h.Write(line.Bytes())
	}
	return id + "-" + hex.EncodeToString(h.Sum(nil)[:idDigest])
}

// ConfigPart is the config digest part of an identity, m-<12 hex>.
func ConfigPart(id string) string {
	if i := strings.LastIndexByte(id, '-'); i > 1 && strings.Count(id, "-") == 2 {
		return id[:i]
	}
	return id
}

// HasTensors reports whether an identity covers a checkpoint's tensors.
func HasTensors(id string) bool { return strings.Count(id, "-") == 2 }

// Match reports whether a process of identity mine may work with one of
// identity theirs: the two are equal, or either covers only a config and
// the config parts are equal. The workers of one job must share one
// identity; the coordinator checks that among them.
func Match(mine, theirs string) bool {
	if mine == theirs {
		return true
	}
	if HasTensors(mine) && HasTensors(theirs) {
		return false
	}
	return ConfigPart(mine) == ConfigPart(theirs)
}

// Identity is the model identity of the model directory dir,
// m-<config digest>-<tensor digest>, with 12 hex digits each. The config
// digest hashes CanonicalConfig of dir's validated config.json, so that
// re-saving the file keeps it; the tensor digest hashes every tensor's
// name, dtype and shape from the shard headers. A dir without a checkpoint
// has the config digest alone, m-<config digest>. Identity reads no tensor
// data, so a checkpoint whose values changed in place keeps its identity.
// docs/PROTOCOL.md, "Model identity", has the reasons.
func Identity(dir string) (string, error) {
	c, err := modelconfig.Load(filepath.Join(dir, ConfigFile))
	if err != nil {
		return "", fmt.Errorf("model identity: %w", err)
	}
	canonical, err := CanonicalConfig(c)
	if err != nil {
		return "", err
	}
	tensors, err := checkpointTensors(dir)
	if err != nil {
		return "", fmt.Errorf("model identity: %w", err)
	}
	return identityOf(canonical, tensors), nil
}

// checkpointTensors is the tensor table of dir's checkpoint, nil when dir
// has none.
func checkpointTensors(dir string) ([]TensorMeta, error) {
	if !hasCheckpoint(dir) {
		return nil, nil
	}
	ck, err := safetensors.Open(dir)
	if err != nil {
		return nil, err
	}
	defer ck.Close()
	names := ck.Names()
	out := make([]TensorMeta, 0, len(names))
	for _, n := range names {
		t, _ := ck.Tensor(n)
		out = append(out, TensorMeta{Name: n, DType: string(t.DType), Shape: t.Shape})
	}
	return out, nil
}

// hasCheckpoint reports whether dir holds an index or a shard.
func hasCheckpoint(dir string) bool {
	if _, err := os.Stat(filepath.Join(dir, safetensors.IndexName)); !errors.Is(err, fs.ErrNotExist) {
		return true
	}
	m, _ := filepath.Glob(filepath.Join(dir, "*.safetensors"))
	return len(m) > 0
}
