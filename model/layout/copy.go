package layout

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"

	"github.com/tandem-inference/tandem/model/safetensors"
)

// CopyFile records, in a directory Copy made, which part of the model it
// holds and which shards are header-only stubs; the checkpoint reader
// refuses to read a stub's data (safetensors.StubsFile).
const CopyFile = safetensors.StubsFile

// Copied is CopyFile's content.
type Copied struct {
	Layers  [2]int   `json:"layers"` // [first, end)
	Globals bool     `json:"globals"`
	Stubs   []string `json:"stubs"` // shards whose data was not copied
}

// Copy makes dst a checkpoint directory for range r of src and returns the
// bytes copied. The shards the range needs are copied whole; every other
// shard of the index becomes a header-only stub that uses no disk, its real
// header followed by a hole up to its real size, because every process
// opens all the shards' headers but reads only its own layers' data. The
// other files, such as config.json, the index and the tokenizer, are copied
// as they are. CopyFile names the stubs, so that Verify with a range that
// needs one says so. dst must not exist or be empty.
func Copy(ctx context.Context, src, dst string, r Range) (int64, error) {
	cfg, idx, err := Open(src)
	if err != nil {
		return 0, err
	}
	if err := r.Validate(cfg); err != nil {
		return 0, err
	}
	if des, err := os.ReadDir(dst); err == nil && len(des) > 0 {
		return 0, fmt.Errorf("%s is not empty", dst)
	}
	if err := os.MkdirAll(dst, 0o755); err != nil {
		return 0, err
	}
	need := map[string]bool{}
	for _, s := range needed(src, idx, r) {
		if s.Size < 0 {
			return 0, fmt.Errorf("%s: shard %s is missing (range %s needs it)", src, s.File, r)
		}
		need[s.File] = true
	}
	shards := map[string]bool{}
	for _, f := range idx.WeightMap {
		if !plainName(f) {
			return 0, fmt.Errorf("%s: %s maps a tensor to %q, not a file name inside the directory", src, safetensors.IndexName, f)
		}
		shards[f] = true
	}
	des, err := os.ReadDir(src)
	if err != nil {
		return 0, err
	}
	var total int64
	rec := Copied{Layers: [2]int{r.Lo, r.Hi}, Globals: r.Globals}
	for _, de := range des {
		if err := ctx.Err(); err != nil {
			return total, err
		}
		name := de.Name()
		if !de.Type().IsRegular() || name == CopyFile {
			continue
		}
		from, to := filepath.Join(src, name), filepath.Join(dst, name)
		var n int64
		switch {
		case shards[name] && !need[name]:
			n, err = stub(from, to)
			rec.Stubs = append(rec.Stubs, name)
		default:
			n, err = copyFile(ctx, from, to)
		}
		if err != nil {
			return total, fmt.Errorf("%s: %w", name, err)
		}
		total += n
	}
	for f := range shards {
		if _, err := os.Stat(filepath.Join(dst, f)); err != nil && !need[f] {
			return total, fmt.Errorf("%s: shard %s (not needed by %s) is missing, so its header cannot be copied: %w", src, f, r, err)
		}
	}
	slices.Sort(rec.Stubs)
	b, _ := json.MarshalIndent(rec, "", "  ")
	if err := os.WriteFile(filepath.Join(dst, CopyFile), append(b, '\n'), 0o644); err != nil {
		return total, err
	}
	return total, nil
}

// copyFile copies a file whole, through a temporary name.
func copyFile(ctx context.Context, from, to string) (int64, error) {
	in, err := os.Open(from)
	if err != nil {
		return 0, err
	}
	defer in.Close()
	return writeFile(to, func(out *os.File) (int64, error) { return io.Copy(out, ctxReader{ctx, in}) })
}

// writeFile writes a file through a temporary name, renamed into place
// once write and the close succeeded (a copy cut short leaves no file
// that looks whole). It returns what write returned.
func writeFile(to string, write func(*os.File) (int64, error)) (int64, error) {
	tmp := to + ".part"
	out, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return 0, err
	}
	n, err := write(out)
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, to)
	}
	if err != nil {
		_ = os.Remove(tmp)
		return n, err
	}
	return n, nil
}

type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}

// stub writes a shard's header bytes and extends the file to the shard's
// size with a hole. It returns the bytes written (the header's).
func stub(from, to string) (int64, error) {
	in, err := os.Open(from)
	if err != nil {
		return 0, err
	}
	defer in.Close()
	st, err := in.Stat()
	if err != nil {
		return 0, err
	}
	var lenBuf [8]byte
	if _, err := io.ReadFull(in, lenBuf[:]); err != nil {
		return 0, fmt.Errorf("reading the header length: %w", err)
	}
	n := binary.LittleEndian.Uint64(lenBuf[:])
	if n > safetensors.MaxHeaderSize || int64(n) > st.Size()-8 {
		return 0, fmt.Errorf("header length %d does not fit the %d-byte file", n, st.Size())
	}
	hdr := make([]byte, 8+n)
	copy(hdr, lenBuf[:])
	if _, err := io.ReadFull(in, hdr[8:]); err != nil {
		return 0, fmt.Errorf("reading the header: %w", err)
	}
	// The rest of the shard is a hole of its size.
	return writeFile(to, func(out *os.File) (int64, error) {
		n, err := out.Write(hdr)
		if err == nil {
			err = out.Truncate(st.Size())
		}
		return int64(n), err
	})
}

// readCopied reads dir's CopyFile; nil when there is none.
func readCopied(dir string) (*Copied, error) {
	b, err := os.ReadFile(filepath.Join(dir, CopyFile))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var c Copied
	if err := json.Unmarshal(b, &c); err != nil {
		return nil, fmt.Errorf("%s: %w", CopyFile, err)
	}
	return &c, nil
}

func (c *Copied) String() string {
	s := fmt.Sprintf("layers %d-%d", c.Layers[0], c.Layers[1]-1)
	if c.Globals {
		s += " and the model-level tensors"
	}
	return s
}

func isStub(c *Copied, file string) bool {
	return c != nil && slices.Contains(c.Stubs, file)
}
