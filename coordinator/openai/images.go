package openai

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"

	"github.com/tandem-inference/tandem/coordinator/images"
)

// imageRef is an image_url part: where it is in the request, and its URL.
type imageRef struct {
	param string // messages[i].content[j].image_url
	url   string
}

// imageRefs lists the request's image_url parts in prompt order (the
// messages' order, each message's parts in order), checking before any is
// read that the model reads images and that there are not too many.
func (p *planner) imageRefs(req *chatRequest) ([]imageRef, *apiError) {
	var refs []imageRef
	for i, m := range req.Messages {
		var parts []contentPart
		if json.Unmarshal(m.Content, &parts) != nil {
			continue // a string or null; a malformed content is the planner's 400
		}
		for j, part := range parts {
			if part.Type != "image_url" {
				continue
			}
			param := fmt.Sprintf("messages[%d].content[%d].image_url", i, j)
			u, err := partURL(part)
			if err != nil {
				return nil, badRequest(param, "%s: %v", param, err)
			}
			refs = append(refs, imageRef{param: param, url: u})
		}
	}
	if len(refs) == 0 {
		return nil, nil
	}
	if !p.info.Vision {
		return nil, badRequest(refs[0].param, "model %s has no vision tower (its checkpoint has no vision_tower weights): it reads text only", p.name)
	}
	if err := p.images.CheckCount(len(refs), 0); err != nil {
		return nil, imageErr(refs, err)
	}
	return refs, nil
}

// readImages reads the images refs name (data: URLs; http(s) when the
// operator allows fetching), within the limits.
func (s *Server) readImages(ctx context.Context, refs []imageRef) ([][]byte, *apiError) {
	out := make([][]byte, len(refs))
	var total int64
	for i, r := range refs {
		data, err := s.images.Read(ctx, i, r.url)
		if err != nil {
			return nil, imageErr(refs, err)
		}
		total += int64(len(data))
		if err := s.plan.images.CheckCount(len(refs), total); err != nil {
			return nil, imageErr(refs, err)
		}
		out[i] = data
	}
	return out, nil
}

// imageErr answers a refused image: 413 for one over a limit, else 400,
// naming the part.
func imageErr(refs []imageRef, err error) *apiError {
	var ie *images.Error
	if !errors.As(err, &ie) {
		return badRequest("messages", "%v", err)
	}
	param := "messages"
	if ie.Index >= 0 && ie.Index < len(refs) {
		param = refs[ie.Index].param
	}
	msg := err.Error()
	if param != "messages" {
		msg = param + ": " + ie.Msg
	}
	if ie.TooLarge {
		return newErr(http.StatusRequestEntityTooLarge, "invalid_request_error", "request_too_large", param, "%s", msg)
	}
	return badRequest(param, "%s", msg)
}
